package main

// kvnode restore: create a new cluster member's data from a backup file
// (kv/backup, written by `kvctl snapshot save`).
//
//	kvnode restore --from FILE --config node1.toml [--cluster-id N] [--same-cluster-id]
//
// It verifies the file completely, restores its snapshot into a new
// data_dir/sm (sm.Restore verifies the stream again as it writes it), and
// creates a fresh acceptor log stamped with the config's cluster id. Every
// member of the new cluster is restored from the same file, so they all
// start at the file's slot with the same state, and elect a leader that
// goes on from there. The new cluster has its own cluster id (and should
// have its own cluster secret): every consensus message carries the
// cluster id and a node drops any other, so a member of the old cluster
// can never be mixed into the new one. For the same reason the membership
// it records is the config's [[peers]] (all voters, with their addresses),
// not the backup's: the file's members are the old cluster's.
//
// It refuses, before creating anything, when the data directory holds
// anything or the acceptor log file exists (a restore creates a member, it
// never overwrites one), when the config's cluster id equals the file's
// (unless --same-cluster-id: for rebuilding a cluster none of whose old
// members will ever run again), and when --cluster-id is given and differs
// from the config's. Anything it created is removed when a later step
// fails, so it can be run again.

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"synod/kv/backup"
	"synod/kv/replica"
	"synod/kv/sm"
	"synod/pmem"
)

// smDirName is the state machine's directory inside data_dir (runNode
// opens the same).
const smDirName = "sm"

// restoreOptions are kvnode restore's flags.
type restoreOptions struct {
	from, config  string
	clusterID     uint64
	sameClusterID bool
}

func parseRestoreFlags(args []string, out io.Writer) (*restoreOptions, error) {
	fs := flag.NewFlagSet("kvnode restore", flag.ContinueOnError)
	fs.SetOutput(out)
	o := &restoreOptions{}
	fs.StringVar(&o.from, "from", "", "backup file to restore (written by kvctl snapshot save)")
	fs.StringVar(&o.config, "config", "", "the new member's config file (its data_dir and pmem.path must not exist yet)")
	fs.Uint64Var(&o.clusterID, "cluster-id", 0, "the new cluster's id; when given it must equal the config's cluster_id (a check against restoring with the old cluster's config)")
	fs.BoolVar(&o.sameClusterID, "same-cluster-id", false, "allow the config's cluster_id to equal the backup's (only when no member of the old cluster will ever run again)")
	fs.Usage = func() {
		fmt.Fprintln(out, "usage: kvnode restore --from FILE --config FILE [--cluster-id N] [--same-cluster-id]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.from == "":
		return nil, errors.New("--from FILE is required")
	case o.config == "":
		return nil, errors.New("--config FILE is required")
	}
	return o, nil
}

// runRestore is `kvnode restore`; it reports what it did on out.
func runRestore(args []string, out io.Writer) error {
	o, err := parseRestoreFlags(args, out)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(o.config)
	if err != nil {
		return err
	}
	if cfg.Replication == "raft" {
		return errors.New("restore: replication = \"raft\" keeps its own storage; restore creates Paxos members only")
	}
	info, err := backup.VerifyFile(o.from)
	if err != nil {
		return fmt.Errorf("restore: %s: %w", o.from, err)
	}
	switch {
	case o.clusterID != 0 && o.clusterID != cfg.ClusterID:
		return fmt.Errorf("restore: --cluster-id %d, but %s says cluster_id = %d: give every new member a config with the new cluster's id",
			o.clusterID, o.config, cfg.ClusterID)
	case cfg.ClusterID == info.ClusterID && !o.sameClusterID:
		return fmt.Errorf("restore: %s has cluster_id = %d, the id of the cluster the backup was taken from: a restored cluster needs a new id, "+
			"so that no member of the old cluster can be mixed into it (set a new cluster_id, or pass --same-cluster-id "+
			"if no member of the old cluster will ever run again)", o.config, cfg.ClusterID)
	}
	smDir := filepath.Join(cfg.DataDir, smDirName)
	if err := mustBeNew(cfg.DataDir, cfg.PMem.Path); err != nil {
		return err
	}

	// Create: the state machine first, then the acceptor log. A failure
	// removes what this run created.
	var created []string
	undo := func() {
		for i := len(created) - 1; i >= 0; i-- {
			os.RemoveAll(created[i])
		}
	}
	if _, err := os.Stat(cfg.DataDir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
			return fmt.Errorf("restore: creating data_dir: %w", err)
		}
		created = append(created, cfg.DataDir)
	}
	created = append(created, smDir, smDir+".restore", smDir+".old")
	if err := restoreSM(smDir, cfg, info, o.from); err != nil {
		undo()
		return err
	}
	if err := os.MkdirAll(filepath.Dir(cfg.PMem.Path), 0o750); err != nil {
		undo()
		return fmt.Errorf("restore: creating the pmem directory: %w", err)
	}
	created = append(created, cfg.PMem.Path)
	plog, _, err := replica.OpenPMemLog(pmem.Options{
		Path: cfg.PMem.Path, SizeBytes: cfg.PMem.SizeBytes, Mode: pmem.Mode(cfg.PMem.Mode),
		ClusterID: cfg.ClusterID, NodeID: cfg.NodeID,
	})
	if err == nil {
		err = plog.Close()
	}
	if err != nil {
		undo()
		return fmt.Errorf("restore: creating the acceptor log %s: %w", cfg.PMem.Path, err)
	}

	fmt.Fprintf(out, "restored node %d of cluster %d from %s\n", cfg.NodeID, cfg.ClusterID, o.from)
	fmt.Fprintf(out, "  backup:        cluster %d, slot %d, members %v, taken %s\n", info.ClusterID, info.Slot, info.Members, info.Created.Format("2006-01-02 15:04:05.000 MST"))
	fmt.Fprintf(out, "  state machine: %s (%d keys of %d tenants, %d exactly-once clients)\n", smDir, info.Snapshot.DataKeys, info.Snapshot.Tenants, info.Snapshot.Clients)
	fmt.Fprintf(out, "  acceptor log:  %s (new, %s, cluster %d, node %d)\n", cfg.PMem.Path, cfg.PMem.Mode, cfg.ClusterID, cfg.NodeID)
	if !sameMembers(info.Members, cfg) {
		fmt.Fprintf(out, "  note: the backup was taken from members %v; this cluster's peers are %v\n", info.Members, peerIDs(cfg))
	}
	fmt.Fprintf(out, "restore every member of the new cluster from the same file, then start each: kvnode --config %s\n", o.config)
	return nil
}

// mustBeNew refuses a data_dir that holds anything or an acceptor log
// that exists: a restore creates a member, it never replaces one.
func mustBeNew(dataDir, pmemPath string) error {
	if ents, err := os.ReadDir(dataDir); err == nil && len(ents) > 0 {
		return fmt.Errorf("restore: data_dir %s is not empty: a restore creates a new member and never overwrites one "+
			"(remove it, or give the new member another data_dir)", dataDir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("restore: data_dir: %w", err)
	}
	if _, err := os.Lstat(pmemPath); err == nil {
		return fmt.Errorf("restore: the acceptor log %s exists: a restore creates a new member and never overwrites one "+
			"(remove it, or give the new member another pmem.path)", pmemPath)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("restore: pmem.path: %w", err)
	}
	return nil
}

// restoreSM creates the state machine at dir from the backup's stream.
func restoreSM(dir string, cfg *Config, info *backup.Info, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer f.Close()
	store, err := sm.Open(dir, cfg.smOptions())
	if err != nil {
		return fmt.Errorf("restore: creating the state machine: %w", err)
	}
	err = store.Restore(info.Stream(f))
	if err == nil && store.Applied() != info.Slot {
		err = fmt.Errorf("applied slot %d after the restore, the backup says %d", store.Applied(), info.Slot)
	}
	if err == nil {
		// The membership is the new cluster's, from the config: the
		// backup's record (if it holds one) names the old cluster's
		// members and addresses, which must never be mixed in (the same
		// reason the cluster id changes). Every member is restored from
		// the same file with the same [[peers]], so they all start from
		// the same membership; later changes go through the log.
		err = store.SetMembership(configMembers(cfg))
	}
	if cerr := store.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("restore: restoring the state machine: %w", err)
	}
	return nil
}

// configMembers is the config's [[peers]] as a membership record: every
// peer a voter, in id order.
func configMembers(cfg *Config) []sm.Member {
	out := make([]sm.Member, 0, len(cfg.Peers))
	for _, p := range cfg.Peers {
		out = append(out, sm.Member{ID: p.ID, ConsensusAddr: p.ConsensusAddr, ClientAddr: p.ClientAddr})
	}
	slices.SortFunc(out, func(a, b sm.Member) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func peerIDs(cfg *Config) []uint64 {
	out := make([]uint64, 0, len(cfg.Peers))
	for _, p := range cfg.Peers {
		out = append(out, p.ID)
	}
	slices.Sort(out)
	return out
}

func sameMembers(ids []uint64, cfg *Config) bool {
	return fmt.Sprint(ids) == fmt.Sprint(peerIDs(cfg))
}
