package raftpath

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
)

// Simulated media for the power-loss tests, after pebble's crashable
// in-memory filesystem: each machine keeps, per file, what the running
// system sees (the page cache) and what is on the medium. Datasync copies
// the first to the second; SyncDir makes a directory's entries durable. A
// power loss replaces every file by what its medium holds, plus possibly
// a prefix of the bytes written since its last sync, cut at a sector
// (simTornGrainBytes): writeback of a sequentially written file may have
// got that far. Creates, renames and removes not followed by a SyncDir of
// their directory are undone. Only the raft path's WAL and snapshot files
// live here (fileSystem); the state machine (Pebble) stays on the real
// disk.

// errPowerLost is what every operation of a machine returns from the
// instant its power fails until it reboots, and what a file opened before
// that instant returns for ever.
var errPowerLost = errors.New("simulated power loss")

// simTornGrainBytes is the grain of a torn write: a sector.
const simTornGrainBytes = 512

// simWorld is the power supply of the machines of one test. One lock
// serialises every file operation of every machine, so that a power loss
// is one instant for all the machines it takes down, and a test that
// records an acknowledgement under the same lock orders it before or after
// that instant.
type simWorld struct {
	mu       sync.Mutex
	rng      *rand.Rand // what survives a power loss
	machines []*simMachine
	// The armed power loss: opsLeft more file operations that change
	// something on a target run, then the power fails on every target
	// before the next one.
	targets []*simMachine
	opsLeft int
	lost    chan struct{} // closed at the armed power loss; nil when none is armed
	stats   simStats
}

type simStats struct {
	tornFiles    int   // files in which a torn prefix of unsynced bytes survived
	droppedBytes int64 // unsynced bytes a power loss threw away
}

func newSimWorld(seed uint64) *simWorld {
	return &simWorld{rng: rand.New(rand.NewPCG(seed, 0x5eed))}
}

// newMachine adds a powered machine with an empty medium.
func (w *simWorld) newMachine() *simMachine {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := &simMachine{w: w, files: map[string]*simInode{}, durable: map[string]*simInode{}, dirs: map[string]bool{}}
	w.machines = append(w.machines, m)
	return m
}

// arm makes the power fail on every target, all at once, just before the
// (ops+1)-th file operation that changes something on any of them. The
// returned channel is closed at that instant.
func (w *simWorld) arm(targets []*simMachine, ops int) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lost != nil {
		panic("simWorld: a power loss is already armed")
	}
	w.targets, w.opsLeft, w.lost = targets, ops, make(chan struct{})
	return w.lost
}

// loseNow makes the armed power loss happen now (if it has not yet).
func (w *simWorld) loseNow() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lost != nil {
		w.powerLossLocked()
	}
}

func (w *simWorld) powerLossLocked() {
	for _, m := range w.targets {
		m.crashLocked()
	}
	close(w.lost)
	w.targets, w.lost = nil, nil
}

// ifPowered runs fn under the world's lock unless every machine is down,
// and reports whether it ran.
func (w *simWorld) ifPowered(fn func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.machines {
		if !m.down {
			fn()
			return true
		}
	}
	return false
}

func (w *simWorld) statsNow() simStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// simMachine is one machine's file system.
type simMachine struct {
	w    *simWorld
	gen  uint64 // power cycles: a file opened in an earlier one fails
	down bool
	// files is the namespace the running system sees; durable the one on
	// the medium, as of each directory's last SyncDir.
	files   map[string]*simInode
	durable map[string]*simInode
	dirs    map[string]bool
}

var _ fileSystem = (*simMachine)(nil)

// simInode is one file.
type simInode struct {
	data  []byte // what reads see (the page cache)
	alloc int64  // preallocated size: reads past data see zeros up to it
	// synced is what the medium holds. Datasync shares data's array
	// (shared): a write below len(synced) copies data first.
	synced      []byte
	syncedAlloc int64
	shared      bool
}

func (ino *simInode) size() int64 { return max(int64(len(ino.data)), ino.alloc) }

// reboot powers the machine up on what its medium held.
func (m *simMachine) reboot() {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	m.down = false
}

// crashLocked cuts the machine's power: every file becomes what its
// medium holds plus, sometimes, a prefix of its unsynced bytes.
func (m *simMachine) crashLocked() {
	w := m.w
	m.gen++
	m.down = true
	names := make([]string, 0, len(m.durable))
	for name := range m.durable {
		names = append(names, name)
	}
	sort.Strings(names) // the rng is drawn in a fixed order: a seed replays
	images := map[*simInode]*simInode{}
	files := make(map[string]*simInode, len(names))
	for _, name := range names {
		ino := m.durable[name]
		img, ok := images[ino]
		if !ok {
			img = w.surviving(ino)
			images[ino] = img
		}
		files[name] = img
	}
	m.files = files
	m.durable = make(map[string]*simInode, len(files))
	for name, ino := range files {
		m.durable[name] = ino
	}
}

// surviving returns what a power loss leaves of ino: two times in five
// only the synced bytes, two in five a torn prefix of the unsynced ones on
// top, one in five everything (writeback had finished).
func (w *simWorld) surviving(ino *simInode) *simInode {
	common := commonPrefix(ino.synced, ino.data)
	var img []byte
	alloc := ino.syncedAlloc
	if mode := w.rng.IntN(5); mode == 4 {
		img, alloc = slices.Clone(ino.data), ino.alloc
	} else {
		cut := common
		if mode >= 2 && len(ino.data) > common {
			c := common + w.rng.IntN(len(ino.data)-common+1)
			cut = max(common, c-c%simTornGrainBytes)
		}
		if cut > common {
			w.stats.tornFiles++
		}
		w.stats.droppedBytes += int64(len(ino.data) - cut)
		img = slices.Clone(ino.data[:cut])
		if len(ino.synced) > cut {
			img = append(img, ino.synced[cut:]...)
		}
	}
	return &simInode{data: img, alloc: alloc, synced: img, syncedAlloc: alloc, shared: true}
}

// commonPrefix returns the length of the longest common prefix of a and
// b.
func commonPrefix(a, b []byte) int {
	const chunkBytes = 4096
	n := min(len(a), len(b))
	i := 0
	for i+chunkBytes <= n && bytes.Equal(a[i:i+chunkBytes], b[i:i+chunkBytes]) {
		i += chunkBytes
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// live fails once the machine is down or when gen is an older power
// cycle's. Callers hold the world's lock.
func (m *simMachine) live(gen uint64) error {
	if m.down || gen != m.gen {
		return errPowerLost
	}
	return nil
}

// change is live for an operation that changes a file or a directory; it
// also counts down the armed power loss and cuts the power when it is due
// (the operation then does not happen).
func (m *simMachine) change(gen uint64) error {
	if err := m.live(gen); err != nil {
		return err
	}
	w := m.w
	if w.lost != nil && slices.Contains(w.targets, m) {
		if w.opsLeft <= 0 {
			w.powerLossLocked()
			return errPowerLost
		}
		w.opsLeft--
	}
	return nil
}

func (m *simMachine) MkdirAll(dir string) error {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if err := m.live(m.gen); err != nil {
		return err
	}
	// Directories are durable at once: the tests make them at start.
	m.dirs[filepath.Clean(dir)] = true
	return nil
}

func (m *simMachine) ReadDir(dir string) ([]string, error) {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if err := m.live(m.gen); err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	if !m.dirs[dir] {
		return nil, &os.PathError{Op: "readdir", Path: dir, Err: os.ErrNotExist}
	}
	var names []string
	for p := range m.files {
		if filepath.Dir(p) == dir {
			names = append(names, filepath.Base(p))
		}
	}
	sort.Strings(names)
	return names, nil
}

func (m *simMachine) Open(path string) (readFile, error) {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if err := m.live(m.gen); err != nil {
		return nil, err
	}
	ino := m.files[filepath.Clean(path)]
	if ino == nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: os.ErrNotExist}
	}
	// Readers see the file as it is now; the raft path never reads a file
	// while it writes it.
	r := io.MultiReader(bytes.NewReader(ino.data), io.LimitReader(zeroReader{}, ino.size()-int64(len(ino.data))))
	return simReadFile{Reader: r, size: ino.size()}, nil
}

func (m *simMachine) Create(path string, excl bool) (writeFile, error) {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if err := m.change(m.gen); err != nil {
		return nil, err
	}
	path = filepath.Clean(path)
	if !m.dirs[filepath.Dir(path)] {
		return nil, &os.PathError{Op: "create", Path: path, Err: os.ErrNotExist}
	}
	ino := m.files[path]
	switch {
	case ino != nil && excl:
		return nil, &os.PathError{Op: "create", Path: path, Err: os.ErrExist}
	case ino != nil:
		ino.data, ino.alloc, ino.shared = nil, 0, false
	default:
		ino = &simInode{}
		m.files[path] = ino
	}
	return &simFile{m: m, gen: m.gen, ino: ino}, nil
}

func (m *simMachine) OpenWrite(path string) (writeFile, error) {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if err := m.live(m.gen); err != nil {
		return nil, err
	}
	ino := m.files[filepath.Clean(path)]
	if ino == nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: os.ErrNotExist}
	}
	return &simFile{m: m, gen: m.gen, ino: ino}, nil
}

func (m *simMachine) Truncate(path string, size int64) error {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if err := m.change(m.gen); err != nil {
		return err
	}
	ino := m.files[filepath.Clean(path)]
	if ino == nil {
		return &os.PathError{Op: "truncate", Path: path, Err: os.ErrNotExist}
	}
	ino.truncate(size)
	return nil
}

func (m *simMachine) Remove(path string) error {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if err := m.change(m.gen); err != nil {
		return err
	}
	path = filepath.Clean(path)
	if m.files[path] == nil {
		return &os.PathError{Op: "remove", Path: path, Err: os.ErrNotExist}
	}
	delete(m.files, path)
	return nil
}

func (m *simMachine) Rename(from, to string) error {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if err := m.change(m.gen); err != nil {
		return err
	}
	from, to = filepath.Clean(from), filepath.Clean(to)
	ino := m.files[from]
	if ino == nil {
		return &os.PathError{Op: "rename", Path: from, Err: os.ErrNotExist}
	}
	delete(m.files, from)
	m.files[to] = ino
	return nil
}

func (m *simMachine) SyncDir(dir string) error {
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if err := m.change(m.gen); err != nil {
		return err
	}
	dir = filepath.Clean(dir)
	for p := range m.durable {
		if filepath.Dir(p) == dir {
			delete(m.durable, p)
		}
	}
	for p, ino := range m.files {
		if filepath.Dir(p) == dir {
			m.durable[p] = ino
		}
	}
	return nil
}

// truncate sets the size (the page cache's; the medium's at the next
// sync).
func (ino *simInode) truncate(size int64) {
	if size <= int64(len(ino.data)) {
		ino.data, ino.alloc = ino.data[:size], 0
		return
	}
	ino.alloc = size
}

// simFile is a file opened for writing.
type simFile struct {
	m   *simMachine
	gen uint64
	ino *simInode
	off int64
}

func (f *simFile) Write(p []byte) (int, error) {
	f.m.w.mu.Lock()
	defer f.m.w.mu.Unlock()
	if err := f.m.change(f.gen); err != nil {
		return 0, err
	}
	ino := f.ino
	// The first byte this write changes (padding included) is below the
	// synced length: stop sharing the medium's array first.
	if ino.shared && min(f.off, int64(len(ino.data))) < int64(len(ino.synced)) {
		ino.data, ino.shared = slices.Clone(ino.data), false
	}
	if gap := f.off - int64(len(ino.data)); gap > 0 {
		ino.data = append(ino.data, make([]byte, gap)...)
	}
	end := f.off + int64(len(p))
	if end > int64(len(ino.data)) {
		ino.data = append(ino.data[:f.off], p...)
	} else {
		copy(ino.data[f.off:], p)
	}
	f.off = end
	return len(p), nil
}

func (f *simFile) Seek(offset int64, whence int) (int64, error) {
	f.m.w.mu.Lock()
	defer f.m.w.mu.Unlock()
	if err := f.m.live(f.gen); err != nil {
		return 0, err
	}
	switch whence {
	case io.SeekStart:
		f.off = offset
	case io.SeekCurrent:
		f.off += offset
	default:
		f.off = f.ino.size() + offset
	}
	return f.off, nil
}

func (f *simFile) Truncate(size int64) error {
	f.m.w.mu.Lock()
	defer f.m.w.mu.Unlock()
	if err := f.m.change(f.gen); err != nil {
		return err
	}
	f.ino.truncate(size)
	return nil
}

func (f *simFile) Datasync() error {
	f.m.w.mu.Lock()
	defer f.m.w.mu.Unlock()
	if err := f.m.change(f.gen); err != nil {
		return err
	}
	ino := f.ino
	ino.synced = ino.data[:len(ino.data):len(ino.data)]
	ino.syncedAlloc, ino.shared = ino.alloc, true
	return nil
}

func (f *simFile) Preallocate(bytes int64) error {
	f.m.w.mu.Lock()
	defer f.m.w.mu.Unlock()
	if err := f.m.change(f.gen); err != nil {
		return err
	}
	f.ino.alloc = max(f.ino.alloc, bytes)
	return nil
}

func (f *simFile) Close() error { return nil }

type simReadFile struct {
	io.Reader
	size int64
}

func (f simReadFile) Close() error         { return nil }
func (f simReadFile) Size() (int64, error) { return f.size, nil }

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
