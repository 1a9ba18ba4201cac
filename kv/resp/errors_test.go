package resp

import (
	"strings"
	"testing"
	"time"

	"synod/kv/proto"
)

// TestErrorText: the RESP error of each status a write or read can get,
// by the prefix Redis clients act on.
func TestErrorText(t *testing.T) {
	for _, tc := range []struct {
		resp  *proto.Response
		write bool
		want  string
	}{
		{&proto.Response{Status: proto.StatusThrottled, RetryAfter: 1500 * time.Microsecond}, true, "BUSY retry-after-ms 2"},
		{&proto.Response{Status: proto.StatusTooLarge, Message: "m"}, true, "ERR too large: m"},
		{&proto.Response{Status: proto.StatusUnavailable, Message: "m"}, true, "UNAVAILABLE m (the write may or may not have been applied)"},
		{&proto.Response{Status: proto.StatusUnavailable, Message: "m"}, false, "TRYAGAIN m"},
		{&proto.Response{Status: proto.StatusNotLeader, Message: "m"}, false, "TRYAGAIN no leader reachable: m"},
		{&proto.Response{Status: proto.StatusNoSpace, Message: "tenant 6 stores 10 bytes"}, true, "OOM tenant 6 stores 10 bytes"},
	} {
		if got := errorText(tc.resp, tc.write); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%v (write %v): %q, want %q", tc.resp.Status, tc.write, got, tc.want)
		}
	}
}
