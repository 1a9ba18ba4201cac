package sm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Staging by ingestion. A snapshot stream is written in key order
// (writeSnapshot iterates the state), so the staging side does not insert
// it record by record into memtables, to be flushed and compacted down the
// LSM as it grows: it writes the records straight into sstables of
// restoreTableBytes, each synced and then ingested into the staging
// Pebble, where it lands in the bottom level (the keys of each table are
// above everything ingested before; nothing else writes there). No
// memtable, flush or compaction: measured (BenchmarkRestoreBySize, 2 GiB
// of 4 KiB values, kv/README.md) the CPU per GB is what matters during a
// catch-up under load, when the flushes and compactions of the old path
// took their CPU from the same cores as the foreground.
//
// The order is checked, not trusted: a key not above the one before is a
// malformed stream (ErrBadSnapshot), as any other malformation.

// restoreTableBytesDefault is the size at which staging closes an sstable
// and ingests it (each one a file in the staged state).
const restoreTableBytesDefault = 64 << 20

// restoreTableBytes is restoreTableBytesDefault; tests shrink it.
var restoreTableBytes uint64 = restoreTableBytesDefault

// restoreTableName is the file each sstable is written to before it is
// ingested (Pebble links or moves it in under its own name).
const restoreTableName = "staging-ingest.sst"

// readSnapshot reads and verifies a snapshot stream into db (a fresh
// database in dir, opened with po) by ingesting sstables, and returns the
// applied slot of its header.
func readSnapshot(db *pebble.DB, po *pebble.Options, dir string, r io.Reader) (uint64, error) {
	in := newIngester(db, po, dir)
	defer in.abort()
	var prev []byte
	slot, _, err := scanSnapshot(r, func(key, val []byte) error {
		if prev != nil && bytes.Compare(key, prev) <= 0 {
			return fmt.Errorf("%w: key %x after %x: out of order", ErrBadSnapshot, key, prev)
		}
		prev = append(prev[:0], key...)
		return in.set(key, val)
	})
	if err != nil {
		return 0, err
	}
	if err := in.ingest(); err != nil {
		return 0, err
	}
	return slot, nil
}

// ingester writes ordered records into one sstable at a time and ingests
// each when it reaches restoreTableBytes (and the last at the end).
type ingester struct {
	db   *pebble.DB
	path string
	opts sstable.WriterOptions
	w    *sstable.Writer
}

// newIngester is the ingester of db (opened with po in dir), writing its
// tables to restoreTableName there.
func newIngester(db *pebble.DB, po *pebble.Options, dir string) *ingester {
	return &ingester{db: db, path: filepath.Join(dir, restoreTableName), opts: tableOptions(po, db)}
}

// tableOptions are the writer options of the bottom level of db, opened
// with po: the table format and block options Pebble would write there
// itself.
func tableOptions(po *pebble.Options, db *pebble.DB) sstable.WriterOptions {
	o := po.Clone()
	o.EnsureDefaults()
	return o.MakeWriterOptions(len(o.Levels)-1, db.TableFormat())
}

func (in *ingester) set(key, val []byte) error {
	if in.w == nil {
		f, err := vfs.Default.Create(in.path, vfs.WriteCategoryUnspecified)
		if err != nil {
			return fmt.Errorf("sm: restore: creating %s: %w", in.path, err)
		}
		in.w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), in.opts)
	}
	if err := in.w.Set(key, val); err != nil {
		return fmt.Errorf("sm: restore: writing a table: %w", err)
	}
	if in.w.Raw().EstimatedSize() >= restoreTableBytes {
		return in.ingest()
	}
	return nil
}

// ingest closes (and so syncs) the open table, ingests it and removes its
// name; nothing when no table is open.
func (in *ingester) ingest() error {
	if in.w == nil {
		return nil
	}
	w := in.w
	in.w = nil
	if err := w.Close(); err != nil {
		os.Remove(in.path)
		return fmt.Errorf("sm: restore: closing a table: %w", err)
	}
	if err := in.db.Ingest(context.Background(), []string{in.path}); err != nil {
		os.Remove(in.path)
		return fmt.Errorf("sm: restore: ingesting a table: %w", err)
	}
	// Pebble may have moved it in rather than linked it.
	if err := os.Remove(in.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sm: restore: removing %s: %w", in.path, err)
	}
	return nil
}

// abort drops a table left open by an error (the staging is discarded).
func (in *ingester) abort() {
	if in.w != nil {
		in.w.Close()
		in.w = nil
		os.Remove(in.path)
	}
}
