// Command libcni-client drives a CNI network configuration list through libcni, the
// library container runtimes (containerd, CRI-O, podman's older path) embed. The
// end-to-end tests use it as a "real runtime client" for cni-ebpf.
//
// It is deliberately small and speaks a machine-friendly protocol:
//
//	libcni-client <add|check|del|version|validate|cached> --conflist FILE [flags]
//	libcni-client serve
//
// add prints the chain's final Result (JSON) on stdout; check and del print nothing on
// success; version prints the VERSION answer of --type (default: the first plugin of the
// conflist); validate runs libcni's ValidateNetworkList (VERSION of every plugin plus
// capability checks) and prints the enabled capabilities; cached prints the
// Result libcni cached after ADD (what CHECK and DEL send as prevResult).
//
// serve is the client as a runtime embeds libcni: one long-lived process (containerd's
// go-cni and CRI-O's ocicni call libcni from their daemon), so no operation pays for
// starting a Go program. It reads one JSON request per line on stdin,
//
//	{"verb":"add","conflist":F,"netns":P,"id":C,"ifname":"eth0","cniPath":"D1:D2",
//	 "cacheDir":D,"capArgs":{...}}
//
// and answers each, in order, with one line on stdout: {"ok":true,"result":R} (R is the
// Result of add and cached, null otherwise) or {"ok":false,"error":F} with F as below.
// Each conflist is read once, on its first request, as a runtime loads its network
// configuration once. It ends at the end of stdin.
//
// On failure it writes one JSON line to stderr,
// {"code":N,"msg":"…","details":"…","error":"…"}, where code/msg/details come from the
// plugin's CNI error (a *types.Error anywhere in the chain of wrapped errors; code 0 when
// the failure was libcni's own), and error is the full wrapped message. Exit status: 1 for
// an operation failure, 2 for a usage error.
//
// libcni 1.1.2 (Debian's golang-github-appc-cni-dev) implements spec 1.0.0: it has no
// GC or STATUS verbs, so neither has this client.
//
// Build (offline, GOPATH mode):
//
//	GOPATH=/usr/share/gocode GO111MODULE=off go build -o libcni-client ./tests/libcni-client
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

const usage = `usage: libcni-client <add|check|del|version|validate|cached> --conflist FILE [flags]
       libcni-client serve   (JSON requests on stdin, one per line)

flags:
  --conflist FILE    network configuration list (JSON); a single plugin config is
                     wrapped into a list
  --netns PATH       CNI_NETNS
  --id CID           CNI_CONTAINERID
  --ifname IF        CNI_IFNAME (default eth0)
  --cni-path DIRS    plugin search path, ':'-separated (default $CNI_PATH)
  --cache-dir DIR    libcni's result cache; required for add/check/del/cached so
                     nothing lands in the machine-wide /var/lib/cni
  --cap-args JSON    capability arguments injected as runtimeConfig, e.g.
                     '{"portMappings":[...],"ips":["10.0.0.5/24"],"mac":"..."}'
  --args K=V;...     CNI_ARGS
  --type NAME        plugin type for 'version' (default: first plugin of --conflist)
  --timeout SECS     overall deadline (default 60)
`

// failure is what the client reports on stderr when an operation fails.
type failure struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
	Error   string `json:"error"`
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(argv []string) int {
	if len(argv) < 1 || strings.HasPrefix(argv[0], "-") {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	verb := argv[0]
	if verb == "serve" {
		if len(argv) != 1 {
			return usageErr("serve takes no arguments")
		}
		return serve()
	}

	fs := flag.NewFlagSet("libcni-client", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	conflist := fs.String("conflist", "", "")
	netns := fs.String("netns", "", "")
	id := fs.String("id", "", "")
	ifname := fs.String("ifname", "eth0", "")
	cniPath := fs.String("cni-path", os.Getenv("CNI_PATH"), "")
	cacheDir := fs.String("cache-dir", "", "")
	capArgs := fs.String("cap-args", "", "")
	cniArgs := fs.String("args", "", "")
	pluginType := fs.String("type", "", "")
	timeout := fs.Int("timeout", 60, "")
	if err := fs.Parse(argv[1:]); err != nil {
		return 2
	}
	if fs.NArg() != 0 {
		return usageErr("unexpected arguments: %q", fs.Args())
	}

	var path []string
	for _, p := range filepath.SplitList(*cniPath) {
		if p != "" {
			path = append(path, p)
		}
	}
	if len(path) == 0 {
		return usageErr("no plugin search path: pass --cni-path or set CNI_PATH")
	}
	cni := libcni.NewCNIConfigWithCacheDir(path, *cacheDir, nil)

	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*timeout)*time.Second)
	defer cancel()

	var list *libcni.NetworkConfigList
	if *conflist != "" {
		var err error
		if list, err = loadList(*conflist); err != nil {
			return fail(err)
		}
	}

	switch verb {
	case "version":
		t := *pluginType
		if t == "" {
			if list == nil || len(list.Plugins) == 0 {
				return usageErr("version needs --type or a --conflist with a plugin")
			}
			t = list.Plugins[0].Network.Type
		}
		info, err := cni.GetVersionInfo(ctx, t)
		if err != nil {
			return fail(err)
		}
		return emit(map[string]interface{}{
			"type":              t,
			"supportedVersions": info.SupportedVersions(),
		})
	case "validate":
		if list == nil {
			return usageErr("validate needs --conflist")
		}
		versions, err := cni.ValidateNetworkList(ctx, list)
		if err != nil {
			return fail(err)
		}
		return emit(map[string]interface{}{"capabilities": versions})
	case "add", "check", "del", "cached":
	case "gc", "status":
		return usageErr("%s: libcni 1.1.2 (spec 1.0.0) has no %s verb", verb, strings.ToUpper(verb))
	default:
		return usageErr("unknown command %q", verb)
	}

	if list == nil {
		return usageErr("%s needs --conflist", verb)
	}
	if *cacheDir == "" {
		return usageErr("%s needs --cache-dir (libcni would otherwise use /var/lib/cni)", verb)
	}
	rt := &libcni.RuntimeConf{
		ContainerID: *id,
		NetNS:       *netns,
		IfName:      *ifname,
	}
	if *capArgs != "" {
		if err := json.Unmarshal([]byte(*capArgs), &rt.CapabilityArgs); err != nil {
			return usageErr("--cap-args is not a JSON object: %v", err)
		}
	}
	if *cniArgs != "" {
		for _, kv := range strings.Split(*cniArgs, ";") {
			if kv == "" {
				continue
			}
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return usageErr("--args entry %q is not K=V", kv)
			}
			rt.Args = append(rt.Args, [2]string{k, v})
		}
	}

	res, err := operate(ctx, cni, list, verb, rt)
	if err != nil {
		return fail(err)
	}
	if res != nil {
		return emit(res)
	}
	return 0
}

// operate runs add, check, del or cached; it returns the Result of add and cached.
func operate(ctx context.Context, cni *libcni.CNIConfig, list *libcni.NetworkConfigList,
	verb string, rt *libcni.RuntimeConf) (interface{}, error) {
	switch verb {
	case "add":
		return cni.AddNetworkList(ctx, list, rt)
	case "check":
		return nil, cni.CheckNetworkList(ctx, list, rt)
	case "del":
		return nil, cni.DelNetworkList(ctx, list, rt)
	case "cached":
		res, err := cni.GetNetworkListCachedResult(list, rt)
		if err != nil {
			return nil, err
		}
		if res == nil {
			return nil, errors.New("no cached result")
		}
		return res, nil
	}
	return nil, fmt.Errorf("unknown verb %q", verb)
}

// request is one line of serve's input.
type request struct {
	Verb     string                 `json:"verb"`
	Conflist string                 `json:"conflist"`
	Netns    string                 `json:"netns"`
	ID       string                 `json:"id"`
	Ifname   string                 `json:"ifname"`
	CNIPath  string                 `json:"cniPath"`
	CacheDir string                 `json:"cacheDir"`
	CapArgs  map[string]interface{} `json:"capArgs"`
}

// response is one line of serve's output.
type response struct {
	OK     bool        `json:"ok"`
	Result interface{} `json:"result"`
	Error  *failure    `json:"error,omitempty"`
}

// serve answers requests from stdin until it ends (see the package comment).
func serve() int {
	lists := map[string]*libcni.NetworkConfigList{}
	runtimes := map[[2]string]*libcni.CNIConfig{}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64*1024), 4*1024*1024)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		res, err := serveOne(in.Bytes(), lists, runtimes)
		reply := response{OK: err == nil, Result: res}
		if err != nil {
			f := failureOf(err)
			reply.Error = &f
		}
		line, err := json.Marshal(reply)
		if err != nil {
			line, _ = json.Marshal(response{Error: &failure{Msg: err.Error(), Error: err.Error()}})
		}
		out.Write(line)
		out.WriteByte('\n')
		if err := out.Flush(); err != nil {
			fmt.Fprintf(os.Stderr, "libcni-client serve: %v\n", err)
			return 1
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "libcni-client serve: reading requests: %v\n", err)
		return 1
	}
	return 0
}

func serveOne(line []byte, lists map[string]*libcni.NetworkConfigList,
	runtimes map[[2]string]*libcni.CNIConfig) (interface{}, error) {
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return nil, fmt.Errorf("request is not JSON: %w", err)
	}
	if req.Conflist == "" || req.CacheDir == "" || req.CNIPath == "" {
		return nil, errors.New("a request needs conflist, cacheDir and cniPath")
	}
	list, ok := lists[req.Conflist]
	if !ok {
		var err error
		if list, err = loadList(req.Conflist); err != nil {
			return nil, err
		}
		lists[req.Conflist] = list
	}
	key := [2]string{req.CNIPath, req.CacheDir}
	cni, ok := runtimes[key]
	if !ok {
		cni = libcni.NewCNIConfigWithCacheDir(filepath.SplitList(req.CNIPath), req.CacheDir, nil)
		runtimes[key] = cni
	}
	ifname := req.Ifname
	if ifname == "" {
		ifname = "eth0"
	}
	rt := &libcni.RuntimeConf{
		ContainerID:    req.ID,
		NetNS:          req.Netns,
		IfName:         ifname,
		CapabilityArgs: req.CapArgs,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return operate(ctx, cni, list, req.Verb, rt)
}

// loadList reads a conflist, or a single network config which it wraps into a list the
// way runtimes do.
func loadList(file string) (*libcni.NetworkConfigList, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if _, ok := probe["plugins"]; ok {
		return libcni.ConfListFromBytes(data)
	}
	conf, err := libcni.ConfFromBytes(data)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(conf)
}

func emit(v interface{}) int {
	out, err := json.Marshal(v)
	if err != nil {
		return fail(err)
	}
	fmt.Println(string(out))
	return 0
}

func fail(err error) int {
	line, _ := json.Marshal(failureOf(err))
	fmt.Fprintln(os.Stderr, string(line))
	return 1
}

// failureOf is the report of a failed operation: the plugin's CNI error where there is one.
func failureOf(err error) failure {
	f := failure{Msg: err.Error(), Error: err.Error()}
	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		f.Code, f.Msg, f.Details = cniErr.Code, cniErr.Msg, cniErr.Details
	}
	return f
}

func usageErr(format string, args ...interface{}) int {
	fmt.Fprintf(os.Stderr, "libcni-client: "+format+"\n", args...)
	return 2
}
