package replica

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"synod/internal/lograte"
	"synod/internal/siphash"
	"synod/paxos"
)

// Authenticated consensus framing. Every consensus datagram (paxos messages
// and accel frames alike) and every side-channel frame is sealed by its
// sender and opened by its receiver before anything else reads it. Layout
// (little endian), part of the wire format:
//
//	offset size field
//	0      1    authMagic
//	1      1    channel: authChannelDatagram, authChannelSide or authChannelSnapshot
//	2      2    reserved, 0
//	4      8    cluster id
//	12     8    sender node id
//	20     8    sender incarnation: nanoseconds since 1970 at its process start
//	28     8    counter: 1, 2, 3 ... per (sender incarnation, channel)
//	36     n    payload (one encoded paxos message or accel frame)
//	36+n   8    tag: SipHash-2-4, under the sender's key, of bytes [0, 36+n)
//
// The sender's key is derived from the cluster secret, the cluster id and
// the sender's id: HMAC-SHA256(secret, "synod consensus mac v1" | cluster |
// sender)[:16]. So a packet authenticates its sender (the id is bound to
// the key), its cluster, and every byte of its payload; a node without the
// secret can neither forge nor alter one. Each receiver keeps, per sender
// and channel, the newest incarnation it saw and a window of the last
// authReplayWindow counters: a packet from an older incarnation, below the
// window, or seen before is dropped, so captured traffic cannot be replayed
// (a new incarnation resets the window; incarnations must grow across
// restarts: kvnode takes the wall clock, or one more than the incarnation
// it recorded in its data_dir when the clock is behind it, because a
// receiver refuses every packet of an older one).
//
// Rotation: a node seals with its first secret and opens with any of its
// secrets, so a cluster moves from secret A to B without downtime by
// restarting its nodes one at a time three times: with [A, B], then with
// [B, A], then with [B] (docs/protocol.md).
const (
	authMagic            = 0xC5
	authChannelDatagram  = 0
	authChannelSide      = 1
	authChannelSnapshot  = 2 // snapshot transfers (snapshot_wire.go)
	authChannelMax       = authChannelSnapshot
	authHeaderBytes      = 36
	authTagBytes         = 8
	authOverheadBytes    = authHeaderBytes + authTagBytes
	authReplayWindow     = 64
	authSecretBytesMin   = 16
	authSecretsMax       = 4
	authRejectLogPeriod  = time.Second
	authKeyDerivationTag = "synod consensus mac v1"
)

// Errors of the authenticated framing (none is logged per packet).
var (
	ErrAuthFailed    = errors.New("replica: consensus packet failed authentication (wrong or missing cluster secret?)")
	errAuthMalformed = errors.New("replica: consensus packet too short or not sealed")
	errAuthReplay    = errors.New("replica: consensus packet replayed or too old")
	errAuthSender    = errors.New("replica: consensus packet from an unknown sender or another cluster")
)

// Auth seals and opens consensus packets for one node. Safe for concurrent
// use.
type Auth struct {
	cluster     uint64
	self        paxos.NodeID
	incarnation uint64
	// keys[i][sender] is the key of sender under secret i; keys[0] is the
	// one this node seals with.
	keys    []map[paxos.NodeID]siphash.Key
	counter [authChannelMax + 1]atomic.Uint64 // per channel

	mu      sync.Mutex
	windows map[windowKey]*replayWindow

	rejected atomic.Uint64
	// logLimit bounds the refusal lines (shouldLog).
	logLimit lograte.Limiter
	// senders is the set of admitted senders, bit id (auth_members.go).
	senders atomic.Uint64
}

type windowKey struct {
	sender  paxos.NodeID
	channel byte
}

type replayWindow struct {
	incarnation uint64
	top         uint64 // highest counter accepted
	seen        uint64 // bit i: counter top-i was accepted
}

// NewAuth builds the authenticator of node self in cluster, admitting the
// given members as senders (setSenders changes them as the membership
// does, auth_members.go). secrets[0] seals; every secret opens (rotation).
func NewAuth(cluster uint64, self paxos.NodeID, members []paxos.NodeID, secrets [][]byte, now time.Time) (*Auth, error) {
	if len(secrets) == 0 || len(secrets) > authSecretsMax {
		return nil, fmt.Errorf("replica: %d cluster secrets; want 1..%d", len(secrets), authSecretsMax)
	}
	a := &Auth{cluster: cluster, self: self, incarnation: uint64(now.UnixNano()), windows: map[windowKey]*replayWindow{},
		logLimit: lograte.Limiter{Every: authRejectLogPeriod}}
	for i, sec := range secrets {
		if len(sec) < authSecretBytesMin {
			return nil, fmt.Errorf("replica: cluster secret %d has %d bytes; want at least %d", i, len(sec), authSecretBytesMin)
		}
		a.keys = append(a.keys, deriveKeys(sec, cluster))
	}
	if !slices.Contains(members, self) {
		return nil, fmt.Errorf("replica: node %d is not among the members it authenticates", self)
	}
	if err := a.setSenders(members); err != nil {
		return nil, err
	}
	return a, nil
}

func deriveKey(secret []byte, cluster uint64, sender paxos.NodeID) siphash.Key {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(authKeyDerivationTag))
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:8], cluster)
	binary.LittleEndian.PutUint64(b[8:16], uint64(sender))
	mac.Write(b[:])
	var k [siphash.KeyBytes]byte
	copy(k[:], mac.Sum(nil))
	return siphash.NewKey(k)
}

// seal appends the sealed form of payload on channel to dst.
func (a *Auth) seal(dst []byte, channel byte, payload []byte) []byte {
	return a.sealParts(dst, channel, payload, nil)
}

// appendSealHeader appends the header of this node's next packet on
// channel (authHeaderBytes; it takes the channel's next counter).
func (a *Auth) appendSealHeader(dst []byte, channel byte) []byte {
	dst = append(dst, authMagic, channel, 0, 0)
	dst = binary.LittleEndian.AppendUint64(dst, a.cluster)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(a.self))
	dst = binary.LittleEndian.AppendUint64(dst, a.incarnation)
	return binary.LittleEndian.AppendUint64(dst, a.counter[channel].Add(1))
}

// sealParts is seal of the payload made of head and then body.
func (a *Auth) sealParts(dst []byte, channel byte, head, body []byte) []byte {
	start := len(dst)
	dst = a.appendSealHeader(dst, channel)
	dst = append(append(dst, head...), body...)
	tag := a.keys[0][a.self].Sum64(dst[start:])
	return binary.LittleEndian.AppendUint64(dst, tag)
}

// SealDatagram returns payload sealed as this node's next datagram (the
// send loop does this for every datagram; exported for tools and tests
// that speak the consensus protocol).
func (a *Auth) SealDatagram(payload []byte) []byte {
	return a.seal(make([]byte, 0, len(payload)+authOverheadBytes), authChannelDatagram, payload)
}

// OpenDatagram authenticates a sealed datagram and returns its payload
// (aliasing b) and sender, as the receive loop does (exported for tools and
// tests that speak the consensus protocol).
func (a *Auth) OpenDatagram(b []byte) ([]byte, paxos.NodeID, error) {
	return a.open(b, authChannelDatagram)
}

// sealedHeader is a parsed header (not yet authenticated).
type sealedHeader struct {
	channel     byte
	cluster     uint64
	sender      paxos.NodeID
	incarnation uint64
	counter     uint64
}

func parseSealedHeader(b []byte) (sealedHeader, error) {
	if len(b) < authHeaderBytes || b[0] != authMagic || b[2] != 0 || b[3] != 0 || b[1] > authChannelMax {
		return sealedHeader{}, errAuthMalformed
	}
	u := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off : off+8]) }
	return sealedHeader{channel: b[1], cluster: u(4), sender: paxos.NodeID(u(12)), incarnation: u(20), counter: u(28)}, nil
}

// verify checks the tag of b[:len(b)-8] under every secret's key of sender.
func (a *Auth) verify(sender paxos.NodeID, signed []byte, tag uint64) bool {
	var want [8]byte
	binary.LittleEndian.PutUint64(want[:], tag)
	ok := 0
	for _, keys := range a.keys {
		k, known := keys[sender]
		if !known {
			continue
		}
		var got [8]byte
		binary.LittleEndian.PutUint64(got[:], k.Sum64(signed))
		ok |= subtle.ConstantTimeCompare(got[:], want[:])
	}
	return ok == 1
}

// open authenticates a sealed packet of channel and returns its payload
// (aliasing b) and sender. The checks run before anything reads the
// payload: framing, cluster, a known sender other than this node, the tag,
// then the replay window.
func (a *Auth) open(b []byte, channel byte) ([]byte, paxos.NodeID, error) {
	return a.openChecked(b, channel, true)
}

// openChecked is open, with the replay window checked (and the counter
// taken) only when window is set.
func (a *Auth) openChecked(b []byte, channel byte, window bool) ([]byte, paxos.NodeID, error) {
	h, err := a.authenticate(b, channel, window, true)
	if err != nil {
		return nil, 0, a.reject(err)
	}
	return b[authHeaderBytes : len(b)-authTagBytes], h.sender, nil
}

// authenticate runs open's checks on b and returns its header: framing,
// cluster, a sender other than this node (and one it admits, with admit),
// the tag, then, with window, the replay window. It counts nothing.
func (a *Auth) authenticate(b []byte, channel byte, window, admit bool) (sealedHeader, error) {
	h, err := parseSealedHeader(b)
	if err != nil || len(b) < authOverheadBytes || h.channel != channel {
		return h, errAuthMalformed
	}
	if h.cluster != a.cluster || h.sender == a.self || h.sender == 0 {
		return h, errAuthSender
	}
	if admit && !a.admits(h.sender) {
		return h, errAuthSender
	}
	signed := b[:len(b)-authTagBytes]
	if !a.verify(h.sender, signed, binary.LittleEndian.Uint64(b[len(b)-authTagBytes:])) {
		return h, ErrAuthFailed
	}
	if window && !a.fresh(h) {
		return h, errAuthReplay
	}
	return h, nil
}

// fresh admits (sender, incarnation, counter) once, within the window.
func (a *Auth) fresh(h sealedHeader) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := windowKey{h.sender, h.channel}
	w := a.windows[k]
	switch {
	case w == nil || h.incarnation > w.incarnation:
		a.windows[k] = &replayWindow{incarnation: h.incarnation, top: h.counter, seen: 1}
		return true
	case h.incarnation < w.incarnation || h.counter+authReplayWindow <= w.top:
		return false
	case h.counter > w.top:
		shift := h.counter - w.top
		if shift >= 64 {
			w.seen = 0
		} else {
			w.seen <<= shift
		}
		w.seen |= 1
		w.top = h.counter
		return true
	default:
		bit := uint64(1) << (w.top - h.counter)
		if w.seen&bit != 0 {
			return false
		}
		w.seen |= bit
		return true
	}
}

// reject counts a refused packet and returns err.
func (a *Auth) reject(err error) error {
	a.rejected.Add(1)
	return err
}

// forgive takes back one refusal its caller found to be a member's own
// delayed traffic, not an attack (sideChannel.overtaken).
func (a *Auth) forgive() { a.rejected.Add(^uint64(0)) }

// Rejected is how many packets and connections this node refused: what
// open and openFrameHead refused, and the refusals its callers report
// through reject (misaddressed payloads, unproven connections past their
// deadline).
func (a *Auth) Rejected() uint64 { return a.rejected.Load() }

// shouldLog reports whether a refusal may be logged now: at most one line
// per authRejectLogPeriod per node, which logs Rejected (the count of
// refusals in all).
func (a *Auth) shouldLog(now time.Time) bool {
	ok, _ := a.logLimit.Allow(now)
	return ok
}

// Side-channel frames are authenticated in two steps, so that nothing is
// buffered for a sender that cannot prove itself: a frame is
//
//	length u32 (of the sealed packet that follows the header tag)
//	header (authHeaderBytes, as above, channel authChannelSide)
//	header tag u64: SipHash-2-4 of length and header under the sender's key
//	the rest of the sealed packet: payload, tag over header and payload
//
// The receiver checks the header tag (cluster, sender, length bound) and
// takes the head's counter into the replay window before it reads the
// payload, and the whole tag after (openFrameHead, openFrameBody).
const sideFrameHeadBytes = 4 + authHeaderBytes + authTagBytes

// sealedFrame is a stream frame sealed around a payload it does not hold:
// on the wire the frame is head, then the payload as given, then tag
// (the layout above). Sealing a large Accept or snapshot chunk this way
// costs no copy of it: the tag is computed over the header and the
// payload where they lie (siphash.Digest), and the writer takes the three
// parts in turn. A sender keeps one sealedFrame and reuses it frame after
// frame (no allocation a frame).
type sealedFrame struct {
	head [sideFrameHeadBytes]byte
	tag  [authTagBytes]byte
}

// sealFrame seals payload as this node's next packet on stream channel
// (authChannelSide or authChannelSnapshot) into f: byte for byte the
// frame of seal's packet (frameSealed), without copying payload.
//
// The payload is head, then body (either may be empty).
func (a *Auth) sealFrame(f *sealedFrame, channel byte, head, body []byte) {
	binary.LittleEndian.PutUint32(f.head[0:4], uint32(authHeaderBytes+len(head)+len(body)+authTagBytes))
	hdr := a.appendSealHeader(f.head[4:4], channel) // in place: f.head has the room
	key := a.keys[0][a.self]
	binary.LittleEndian.PutUint64(f.head[4+authHeaderBytes:], key.Sum64(f.head[:4+authHeaderBytes]))
	d := key.Digest()
	d.Write(hdr)
	d.Write(head)
	d.Write(body)
	binary.LittleEndian.PutUint64(f.tag[:], d.Sum64())
}

// write writes the frame f sealed around the payload head, body to w.
func (f *sealedFrame) write(w io.Writer, head, body []byte) error {
	if _, err := w.Write(f.head[:]); err != nil {
		return err
	}
	if _, err := w.Write(head); err != nil {
		return err
	}
	if _, err := w.Write(body); err != nil {
		return err
	}
	_, err := w.Write(f.tag[:])
	return err
}

// openSideHead authenticates a frame head (sideFrameHeadBytes) and returns
// the length of the sealed packet and its header, before the payload is
// read.
func (a *Auth) openSideHead(head []byte, lengthMax int) (sealedLen int, err error) {
	return a.openFrameHead(head, authChannelSide, lengthMax)
}

// openFrameHead is openSideHead for any stream channel.
func (a *Auth) openFrameHead(head []byte, channel byte, lengthMax int) (sealedLen int, err error) {
	n := int(binary.LittleEndian.Uint32(head[0:4]))
	h, err := parseSealedHeader(head[4 : 4+authHeaderBytes])
	if err != nil || h.channel != channel || n < authOverheadBytes {
		return 0, a.reject(errAuthMalformed)
	}
	if h.cluster != a.cluster || h.sender == a.self || h.sender == 0 {
		return 0, a.reject(errAuthSender)
	}
	if !a.admits(h.sender) {
		return 0, a.reject(errAuthSender)
	}
	if !a.verify(h.sender, head[:4+authHeaderBytes], binary.LittleEndian.Uint64(head[4+authHeaderBytes:])) {
		return 0, a.reject(ErrAuthFailed)
	}
	if n > lengthMax {
		return 0, a.reject(fmt.Errorf("%w: %d bytes", errSideFrameTooLarge, n))
	}
	// The head's counter is taken here, at the head, not once the body
	// authenticates: a copy of a head this node already took is refused
	// before the connection is given time or buffer for a body, and so
	// is a second copy of a head captured on its way to another node
	// (fresh here once, as the seal does not name the receiver). An
	// outside tester held such a head's connection for the 5 s
	// probation deadline again and again while the counter was only
	// peeked at. A sender seals every frame anew (a new counter), so no
	// genuine frame is ever sent twice.
	if !testingSideProvenAtHead.Load() && !a.fresh(h) {
		return 0, a.reject(errAuthReplay)
	}
	return n, nil
}

// openSideBody authenticates the sealed packet of a frame (its header from
// the head, then the rest as read, in one buffer) and returns the payload,
// aliasing sealed.
func (a *Auth) openSideBody(sealed []byte) ([]byte, error) {
	payload, _, err := a.openFrameBody(sealed, authChannelSide)
	return payload, err
}

// openFrameBody authenticates the sealed packet of a stream frame whose
// head openFrameHead took: the whole tag, and nothing of the replay window,
// which the head's counter already passed (the header is the head's, copied
// into sealed by the caller). It returns the payload, aliasing sealed, and
// the sender.
func (a *Auth) openFrameBody(sealed []byte, channel byte) ([]byte, paxos.NodeID, error) {
	if testingSideProvenAtHead.Load() {
		return a.open(sealed, channel) // planted: the window checked only here, as before
	}
	return a.openChecked(sealed, channel, false)
}
