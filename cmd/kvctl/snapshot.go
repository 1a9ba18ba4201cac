package main

// kvctl snapshot save FILE / kvctl snapshot status FILE: backups of a
// whole cluster (kv/backup), taken from the leader's admin endpoint
// (GET /snapshot, kvnode's snapshot.go), with the admin token: a backup
// holds every tenant's keys, so it is an operator's action, not a
// tenant's.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"synod/kv/backup"
)

// Environment variables and limits of the snapshot commands.
const (
	envAdmin      = "SYNOD_ADMIN"       // comma-separated admin endpoints (host:port or http://host:port)
	envAdminToken = "SYNOD_ADMIN_TOKEN" // the nodes' [admin] token
	// snapshotStallTimeout: a save gives up when no byte arrives for
	// this long (the node's own bound on a stalled reader is 30 s).
	snapshotStallTimeout = 30 * time.Second
	// adminTokenFileBytesMax bounds --admin-token-file.
	adminTokenFileBytesMax = 4 << 10
	// adminErrorBytesMax bounds the error text read from a refusal.
	adminErrorBytesMax = 4 << 10
	// partialSuffix names the file a save writes before it is verified.
	partialSuffix = ".partial"
)

type snapshotFlags struct {
	admin     string
	token     string
	tokenFile string
	force     bool
}

func newSnapshotCmd(g *globals) *cobra.Command {
	f := &snapshotFlags{}
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Back up a cluster to a file, or check a backup file",
	}
	save := &cobra.Command{
		Use:   "save FILE",
		Short: "Stream a consistent snapshot of the whole cluster from the leader's admin endpoint into FILE",
		Long: "Stream a consistent snapshot of the whole cluster from the leader's admin endpoint into FILE.\n" +
			"The leader takes it after a read barrier, so it holds every write acknowledged before the\n" +
			"request. FILE is written as FILE" + partialSuffix + ", verified completely, and only then renamed.\n" +
			"Restore it with kvnode restore --from FILE --config NEW.toml on every member of a new cluster.",
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			ctx := c.Context()
			if c.Flags().Changed("timeout") {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, g.timeout)
				defer cancel()
			}
			return f.save(ctx, args[0], c.OutOrStdout())
		},
	}
	save.Flags().StringVar(&f.admin, "admin", "", "comma-separated admin endpoints of the members, host:port (env "+envAdmin+")")
	save.Flags().StringVar(&f.token, "admin-token", "", "the nodes' [admin] token (env "+envAdminToken+")")
	save.Flags().StringVar(&f.tokenFile, "admin-token-file", "", "read the [admin] token from this file")
	save.Flags().BoolVar(&f.force, "force", false, "replace FILE if it exists")
	status := &cobra.Command{
		Use:   "status FILE",
		Short: "Verify a backup file completely and print what it holds",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			info, err := backup.VerifyFile(args[0])
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			printBackup(c.OutOrStdout(), args[0], info)
			return nil
		},
	}
	cmd.AddCommand(save, status)
	return cmd
}

// endpoints returns the admin base URLs and the token.
func (f *snapshotFlags) endpoints() ([]string, string, error) {
	list := f.admin
	if list == "" {
		list = os.Getenv(envAdmin)
	}
	var urls []string
	for _, e := range strings.Split(list, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		if !strings.Contains(e, "://") {
			e = "http://" + e
		}
		u, err := url.Parse(e)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, "", fmt.Errorf("admin endpoint %q is not host:port or http(s)://host:port", e)
		}
		urls = append(urls, strings.TrimSuffix(u.String(), "/"))
	}
	if len(urls) == 0 {
		return nil, "", fmt.Errorf("no admin endpoints: pass --admin or set %s (the members' admin_listen addresses)", envAdmin)
	}
	token := f.token
	if f.tokenFile != "" {
		if token != "" {
			return nil, "", errors.New("give --admin-token or --admin-token-file, not both")
		}
		st, err := os.Stat(f.tokenFile)
		if err != nil {
			return nil, "", err
		}
		if st.Size() > adminTokenFileBytesMax {
			return nil, "", fmt.Errorf("--admin-token-file: %d bytes, at most %d", st.Size(), adminTokenFileBytesMax)
		}
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return nil, "", err
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		token = os.Getenv(envAdminToken)
	}
	return urls, token, nil
}

// save asks each admin endpoint in turn for GET /snapshot until the
// leader streams one, writes it to path+partialSuffix, verifies it and
// renames it to path.
func (f *snapshotFlags) save(ctx context.Context, path string, out io.Writer) error {
	urls, token, err := f.endpoints()
	if err != nil {
		return err
	}
	if _, err := os.Stat(path); err == nil && !f.force {
		return fmt.Errorf("%s exists (pass --force to replace it)", path)
	}
	partial := path + partialSuffix
	var errs []error
	for _, base := range urls {
		err := f.saveFrom(ctx, base, token, partial)
		if err == nil {
			break
		}
		os.Remove(partial)
		var refused *adminRefusal
		if !errors.As(err, &refused) || refused.code != http.StatusConflict {
			// Not "ask another node": stop here.
			return fmt.Errorf("%s: %w", base, err)
		}
		errs = append(errs, fmt.Errorf("%s: %w", base, err))
		if len(errs) == len(urls) {
			return fmt.Errorf("no endpoint is the leader's:\n%w", errors.Join(errs...))
		}
	}
	info, err := backup.VerifyFile(partial)
	if err != nil {
		os.Remove(partial)
		return fmt.Errorf("the received backup does not verify (nothing saved): %w", err)
	}
	if err := os.Rename(partial, path); err != nil {
		os.Remove(partial)
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync() // the rename survives a crash
		d.Close()
	}
	printBackup(out, path, info)
	return nil
}

// adminRefusal is a non-200 answer of an admin endpoint.
type adminRefusal struct {
	code int
	msg  string
}

func (e *adminRefusal) Error() string {
	if e.code == http.StatusUnauthorized {
		return fmt.Sprintf("%d %s: pass the nodes' [admin] token (--admin-token, --admin-token-file or %s)", e.code, http.StatusText(e.code), envAdminToken)
	}
	return fmt.Sprintf("%d %s: %s", e.code, http.StatusText(e.code), e.msg)
}

// saveFrom streams base's GET /snapshot into a new file at partial.
func (f *snapshotFlags) saveFrom(ctx context.Context, base, token, partial string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/snapshot", nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// A node that stops answering (before the stream, or in it) ends the
	// request after snapshotStallTimeout without a byte.
	stall := time.AfterFunc(snapshotStallTimeout, cancel)
	defer stall.Stop()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, adminErrorBytesMax))
		return &adminRefusal{code: resp.StatusCode, msg: strings.TrimSpace(string(msg))}
	}
	file, err := os.OpenFile(partial, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(file, &progressReader{r: resp.Body, stall: stall})
	if err == nil {
		err = file.Sync()
	}
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("receiving the snapshot: %w", err)
	}
	return nil
}

// progressReader re-arms the stall timer on every read that returns bytes.
type progressReader struct {
	r     io.Reader
	stall *time.Timer
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.stall.Reset(snapshotStallTimeout)
	}
	return n, err
}

// printBackup prints what a verified backup file holds.
func printBackup(out io.Writer, path string, info *backup.Info) {
	fmt.Fprintf(out, "file:       %s (%d bytes, format version %d, verified)\n", path, info.FileBytes, info.Version)
	fmt.Fprintf(out, "cluster:    %d\n", info.ClusterID)
	fmt.Fprintf(out, "slot:       %d\n", info.Slot)
	fmt.Fprintf(out, "members:    %v\n", info.Members)
	fmt.Fprintf(out, "created:    %s\n", info.Created.UTC().Format(time.RFC3339Nano))
	s := info.Snapshot
	fmt.Fprintf(out, "contents:   %d keys (%d bytes) of %d tenants; %d exactly-once clients, %d tombstones; %d records\n",
		s.DataKeys, s.DataBytes, s.Tenants, s.Clients, s.Tombstones, s.Records)
	fmt.Fprintf(out, "sha256:     %x\n", info.SHA256)
}
