//! containerd's CRI path as kubelet drives it: Debian's containerd 1.6
//! runs inside a simulated node (`testbed/src/containerd.rs`), with cni-ebpf as its only
//! network, and a CRI v1 client (the `k8s-cri` crate) runs pod sandboxes with Kubernetes
//! metadata and `portMappings`, starts busybox containers in them, and checks real
//! traffic: pod ↔ pod and pod → outside from inside the containers (`ExecSync`), outside →
//! `nodeIP:hostPort` from the `ext` namespace. The addresses the CRI reports must be the
//! ones cni-ebpf's IPAM reserved for the sandbox, and after StopPodSandbox and
//! RemovePodSandbox nothing may be left: no host veth, route or address in the node, no
//! endpoint or port-mapping entry, no reservation. Also: a containerd restart with pods
//! running, and `ctr run --cni` (ctr's own CNI path, with the fixed `/etc/cni/net.d` and
//! `/opt/cni/bin` of containerd's private mount namespace).
//!
//! The conflist is `cniVersion` 1.0.0: Debian's containerd 1.6.20 is built on libcni
//! 1.1.2, which cannot read a 1.1.0 result.

use std::{
    process::Child,
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use testbed::{
    containerd::{Containerd, PodSpec, PodStatus, BUSYBOX_IMAGE},
    inspect::host_veths,
    tcp_request, ConfBuilder, SimNode, Snapshot, WhoAmIServer, EXT_IP4, NODE_IP4,
};

/// The network's name (conflist `name`, pin and store directory).
const NET: &str = "crinet";
/// The port the `ext` namespace's "who am I" server listens on.
const EXT_PORT: u16 = 9000;
/// Bound of one request from or to a container.
const REQ_TIMEOUT: Duration = Duration::from_secs(5);

/// Dual stack, masquerade to the outside, cniVersion 1.0.0 (what libcni 1.1.2 reads).
fn conf(node: &SimNode) -> ConfBuilder {
    node.conf()
        .name(NET)
        .version("1.0.0")
        .set("ipMasq", json!(true))
        .set("clusterCIDRs", json!(["10.244.0.0/16", "fd00:10:244::/48"]))
}

/// busybox `httpd` on port 80 serving the pod's name.
const HTTPD: &str =
    "mkdir -p /www && echo \"$POD_NAME\" > /www/index.html && exec httpd -f -p 80 -h /www";

/// Starts the web container in `sandbox`; returns its container ID.
fn start_web(cd: &Containerd, sandbox: &str, pod: &PodSpec) -> String {
    cd.start_container(
        sandbox,
        pod,
        "web",
        &["sh", "-c", HTTPD],
        &[("POD_NAME", &pod.name)],
    )
}

/// `GET /` of the web server at `addr` port 80 from inside container `from` (busybox `nc`:
/// Debian's static busybox `wget` crashes in glibc's resolver), retried for a few seconds
/// (the server may still be starting). Returns the body.
#[track_caller]
fn fetch(cd: &Containerd, from: &str, addr: &str) -> String {
    let cmd = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {addr} 80");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = cd.exec(from, &["sh", "-c", &cmd], REQ_TIMEOUT * 2);
        if out.exit_code == 0 && out.stdout.contains("200 OK") {
            return out
                .stdout
                .split("\r\n\r\n")
                .nth(1)
                .unwrap_or_default()
                .trim()
                .to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "GET http://{addr}/ from {from}: {out}"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// `GET /` over TCP from the `ext` namespace to `addr` (`ip:port`), retried for a few
/// seconds. Returns the whole HTTP answer.
#[track_caller]
fn fetch_from_ext(node: &SimNode, addr: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match tcp_request(
            node.ext_netns(),
            addr,
            b"GET / HTTP/1.0\r\n\r\n",
            REQ_TIMEOUT,
        ) {
            Ok(answer) if answer.contains("200 OK") => return answer,
            other => assert!(
                Instant::now() < deadline,
                "GET http://{addr}/ from ext: {other:?}"
            ),
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// Sends a line from container `from` to the `ext` server; returns what the server saw
/// as the peer (`ip:port`).
#[track_caller]
fn peer_seen_by_ext(cd: &Containerd, from: &str) -> String {
    let cmd = format!("echo hello | nc -w 3 {EXT_IP4} {EXT_PORT}");
    let out = cd.exec(from, &["sh", "-c", &cmd], REQ_TIMEOUT * 2);
    let first = out.ok().lines().next().unwrap_or_default().to_owned();
    assert!(!first.is_empty(), "no answer from the ext server: {out}");
    first
}

/// The addresses the CRI reports for `sandbox` are exactly those cni-ebpf reserved for
/// `(sandbox, eth0)`, and each has an endpoint entry.
#[track_caller]
fn assert_cri_matches_ipam(node: &SimNode, sandbox: &str, st: &PodStatus) {
    let store = node.store(NET);
    assert!(
        store.has_key(sandbox, "eth0"),
        "no reservation for ({sandbox}, eth0): {store:#?}"
    );
    assert_eq!(
        st.ips.len(),
        2,
        "dual stack: one IPv4 and one IPv6 address: {st:?}"
    );
    assert!(st.ip4().starts_with("10.244.1."), "{st:?}");
    for ip in &st.ips {
        assert!(
            store.ips.iter().any(|held| held == ip),
            "CRI reports {ip} for {sandbox}, the IPAM store holds {:?}",
            store.ips
        );
    }
    // The datapath's endpoint entries of the sandbox: one per address, both families.
    let endpoints = node.endpoints(NET);
    let mut mine: Vec<&str> = endpoints
        .iter()
        .filter(|e| e["container_id"].as_str() == Some(sandbox) && e["ifname"] == "eth0")
        .filter_map(|e| e["ip"].as_str())
        .collect();
    mine.sort_unstable();
    let mut want: Vec<&str> = st.ips.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(mine, want, "endpoint entries of {sandbox}: {endpoints:#?}");
}

/// After every pod is gone: the CRI lists none, and the node is as it was before the
/// pods (links, addresses, routes), with no endpoint, port mapping or reservation.
#[track_caller]
fn assert_nothing_left(node: &SimNode, cd: &Containerd, before: &Snapshot, context: &str) {
    assert!(
        cd.pods().is_empty(),
        "{context}: pods left: {:?}",
        cd.pods()
    );
    // containerd's DELs returned before their finishing processes were done.
    testbed::plugin::settle_network(&conf(node).conflist());
    let veths = host_veths(node.netns());
    assert!(veths.is_empty(), "{context}: host veths left: {veths:?}");
    let d = node.snapshot().diff(before);
    assert!(
        d.is_empty(),
        "{context}: the node changed:\n{}",
        d.join("\n")
    );
    let doc = node.datapath(NET).unwrap_or(Value::Null);
    for key in ["endpoints", "portMappings"] {
        let left = doc[key].as_array().cloned().unwrap_or_default();
        assert!(left.is_empty(), "{context}: {key} left: {left:#?}");
    }
    node.store(NET).assert_empty(context);
}

/// A node with the programs loaded (by a throwaway ADD and DEL) and its baseline, then
/// containerd inside it.
fn setup(test: &str) -> (SimNode, Snapshot, Containerd) {
    let node = SimNode::new(test);
    let conf = conf(&node);
    node.warm_up(&conf);
    let before = node.snapshot();
    let cd = Containerd::start(&node, &conf);
    (node, before, cd)
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn cri_pods_get_addresses_host_ports_and_traffic_and_leave_nothing() {
    let (node, before, mut cd) = setup("cri_pods");
    let version = cd.version();
    assert!(version.starts_with("containerd"), "{version}");
    let images = cd.images();
    assert!(images.iter().any(|i| i == BUSYBOX_IMAGE), "{images:?}");
    let _ext = WhoAmIServer::start(node.ext_netns(), EXT_PORT);

    let a = PodSpec::new("web-a").host_port(8080, 80);
    let b = PodSpec::new("web-b");
    let sa = cd.run_pod(&a);
    let sb = cd.run_pod(&b);
    let (st_a, st_b) = (cd.pod_status(&sa), cd.pod_status(&sb));
    assert!(st_a.ready && st_b.ready, "{st_a:?} {st_b:?}");
    assert_cri_matches_ipam(&node, &sa, &st_a);
    assert_cri_matches_ipam(&node, &sb, &st_b);
    // The sandbox's own namespace has the address the CRI reports, on eth0.
    let in_pod = testbed::inspect::global_addresses(&st_a.netns(), "eth0");
    assert!(
        in_pod
            .iter()
            .any(|c| c.starts_with(&format!("{}/", st_a.ip4()))),
        "{in_pod:?} vs {st_a:?}"
    );
    // The CRI kept the pod's Kubernetes metadata, and containerd recorded the plugin's
    // result with the addresses it reports.
    assert_eq!(
        st_a.metadata,
        (a.name.clone(), a.namespace.clone(), a.uid.clone()),
        "{st_a:?}"
    );
    let cni_result = st_a.info["cniResult"].to_string();
    assert!(
        st_a.ips.iter().all(|ip| cni_result.contains(ip.as_str())),
        "containerd's record of the CNI result: {cni_result}"
    );
    // kubelet's metadata reached the plugin (K8S_POD_* in CNI_ARGS, set by containerd):
    // `inspect` names the pod of each endpoint.
    let dp = node.datapath(NET).unwrap_or(Value::Null);
    let pod_of = |ip: &str| {
        dp["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["ip"].as_str() == Some(ip))
            .map(|e| e["pod"].clone())
            .unwrap_or(Value::Null)
    };
    for (st, meta) in [(&st_a, &a), (&st_b, &b)] {
        let pod = pod_of(st.ip4());
        assert_eq!(
            (&pod["namespace"], &pod["name"], &pod["uid"]),
            (
                &Value::from(meta.namespace.as_str()),
                &Value::from(meta.name.as_str()),
                &Value::from(meta.uid.as_str())
            ),
            "inspect's pod of {}: {dp:#}",
            st.ip4()
        );
    }
    // The hostPort became one port-mapping entry per family of the pod: TCP 8080 → pod
    // a:80 (its IPv4 and its IPv6 address), owned by the sandbox.
    let mappings = dp["portMappings"].clone();
    let list = mappings.as_array().cloned().unwrap_or_default();
    let mut pods: Vec<&str> = list.iter().filter_map(|m| m["pod_ip"].as_str()).collect();
    pods.sort_unstable();
    let mut want: Vec<&str> = st_a.ips.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert!(
        pods == want
            && list.iter().all(|m| m["host_port"] == 8080
                && m["container_port"] == 80
                && m["protocol"]
                    .as_str()
                    .is_some_and(|p| p.eq_ignore_ascii_case("tcp"))
                && m["container_id"].as_str() == Some(sa.as_str())),
        "port mappings (want one to each of {want:?}): {mappings:#}"
    );

    let ca = start_web(&cd, &sa, &a);
    let cb = start_web(&cd, &sb, &b);
    // pod ↔ pod, both families.
    for (from, to, name) in [(&ca, &st_b, "web-b"), (&cb, &st_a, "web-a")] {
        for ip in &to.ips {
            assert_eq!(fetch(&cd, from, ip), name, "{from} → {ip}");
        }
    }
    // pod → outside: masqueraded to the node's address.
    for c in [&ca, &cb] {
        let peer = peer_seen_by_ext(&cd, c);
        assert!(peer.starts_with(&format!("{NODE_IP4}:")), "ext saw {peer}");
    }
    // outside → nodeIP:hostPort reaches pod a's container port.
    let answer = fetch_from_ext(&node, &format!("{NODE_IP4}:8080"));
    assert!(answer.trim_end().ends_with("web-a"), "{answer}");

    cd.stop_and_remove_pod(&sa);
    assert!(
        !node.store(NET).has_key(&sa, "eth0"),
        "StopPodSandbox released nothing"
    );
    assert!(
        tcp_request(
            node.ext_netns(),
            &format!("{NODE_IP4}:8080"),
            b"x",
            Duration::from_secs(1)
        )
        .is_err(),
        "host port 8080 still answers after its pod is gone"
    );
    // The other pod is untouched.
    assert_eq!(fetch(&cd, &cb, &st_b.ips[0]), "web-b");
    cd.stop_and_remove_pod(&sb);
    assert_nothing_left(
        &node,
        &cd,
        &before,
        "after StopPodSandbox + RemovePodSandbox",
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn cri_pods_keep_working_across_a_containerd_restart() {
    let (node, before, mut cd) = setup("cri_restart");
    let a = PodSpec::new("keep-a").host_port(8081, 80);
    let b = PodSpec::new("keep-b");
    let sa = cd.run_pod(&a);
    let sb = cd.run_pod(&b);
    let ca = start_web(&cd, &sa, &a);
    let cb = start_web(&cd, &sb, &b);
    let (st_a, st_b) = (cd.pod_status(&sa), cd.pod_status(&sb));
    assert_eq!(fetch(&cd, &ca, st_b.ip4()), "keep-b");
    let pid = cd.pid();

    // SIGTERM by PID, then the same configuration and state directories again: the
    // shims and the pods' namespaces outlive the daemon, as on a node.
    cd.restart_daemon();
    assert_ne!(cd.pid(), pid, "containerd was not restarted");
    let mut pods = cd.pods();
    pods.sort();
    let mut want = vec![sa.clone(), sb.clone()];
    want.sort();
    assert_eq!(pods, want, "the pods after the restart");
    for (s, before_restart) in [(&sa, &st_a), (&sb, &st_b)] {
        let st = cd.pod_status(s);
        assert!(st.ready, "{st:?}");
        assert_eq!(
            st.ips, before_restart.ips,
            "addresses changed across the restart"
        );
        assert_cri_matches_ipam(&node, s, &st);
    }
    // Still answering: pod ↔ pod through the CRI of the new daemon, and the host port.
    assert_eq!(fetch(&cd, &ca, st_b.ip4()), "keep-b");
    assert_eq!(fetch(&cd, &cb, st_a.ip4()), "keep-a");
    let answer = fetch_from_ext(&node, &format!("{NODE_IP4}:8081"));
    assert!(answer.trim_end().ends_with("keep-a"), "{answer}");

    cd.stop_and_remove_pod(&sa);
    cd.stop_and_remove_pod(&sb);
    assert_nothing_left(&node, &cd, &before, "after a restart and removal");
}

/// Waits (bounded) until `pred` holds, polling every 100 ms.
#[track_caller]
fn wait_for(what: &str, timeout: Duration, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !pred() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(100));
    }
}

/// The address (IPv4) the store holds for `container_id`, if any: the `ips/` entry whose
/// file names it.
fn held_ip4(node: &SimNode, container_id: &str) -> Option<String> {
    let store = node.store(NET);
    store.ips.iter().find_map(|ip| {
        let body = std::fs::read_to_string(store.dir.join("ips").join(ip)).unwrap_or_default();
        (body.contains(container_id) && !ip.contains(':')).then(|| ip.clone())
    })
}

/// Stops the foreground `ctr run` by its PID (SIGTERM, which ctr forwards to the task) and
/// waits for it; SIGKILL after 20 s.
fn stop_ctr(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
        }
    }
}

/// Kills and reaps a `ctr run` left running when a test fails.
struct CtrGuard(Child);

impl Drop for CtrGuard {
    fn drop(&mut self) {
        stop_ctr(&mut self.0);
    }
}

/// `ctr run` of a busybox container `name` with CNI, running `sh -c script`.
fn ctr_run_sh<'a>(name: &'a str, script: &'a str) -> [&'a str; 10] {
    [
        "run",
        "--rm",
        "--cni",
        "--snapshotter",
        "native",
        BUSYBOX_IMAGE,
        name,
        "sh",
        "-c",
        script,
    ]
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn ctr_run_cni_attaches_and_detaches_containers() {
    let (node, before, cd) = setup("ctr_cni");
    let _ext = WhoAmIServer::start(node.ext_netns(), EXT_PORT);
    let tag = node.tag().to_owned();
    // ctr names the attachment `<namespace>-<container>`.
    let (srv, cli) = (format!("srv-{tag}"), format!("cli-{tag}"));
    let (srv_id, cli_id) = (format!("default-{srv}"), format!("default-{cli}"));
    let server_sh = "trap 'exit 0' TERM; mkdir -p /www; echo ctr-server > /www/index.html; \
                     httpd -p 80 -h /www; while true; do sleep 1; done";
    let log = cd.dir().join("ctr-server.log");
    let mut server = CtrGuard(cd.spawn_ctr(&ctr_run_sh(&srv, server_sh), &log));
    wait_for("the server's reservation", Duration::from_secs(30), || {
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!(
                "ctr run exited with {status}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        held_ip4(&node, &srv_id).is_some()
    });
    let srv_ip = held_ip4(&node, &srv_id).unwrap_or_default();
    assert!(
        node.store(NET).has_key(&srv_id, "eth0"),
        "{:#?}",
        node.store(NET)
    );

    let client_sh = format!(
        "ip -o -4 addr show dev eth0; get() {{ printf 'GET / HTTP/1.0\\r\\n\\r\\n' | \
         nc -w 3 {srv_ip} 80; }}; get || {{ sleep 1; get; }}; \
         echo hello | nc -w 3 {EXT_IP4} {EXT_PORT}"
    );
    let out = cd.ctr(&ctr_run_sh(&cli, &client_sh));
    let stdout = out.ok();
    assert!(
        stdout.contains("inet 10.244.1."),
        "no cni-ebpf address on eth0: {out}"
    );
    assert!(
        stdout.contains("ctr-server"),
        "the server did not answer: {out}"
    );
    assert!(
        stdout.contains(&format!("{NODE_IP4}:")),
        "the outside did not see the node's address: {out}"
    );
    // ctr ran DEL for the client when it exited; the server is still attached.
    let store = node.store(NET);
    assert!(!store.has_key(&cli_id, "eth0"), "{store:#?}");
    assert!(store.has_key(&srv_id, "eth0"), "{store:#?}");
    assert_eq!(
        host_veths(node.netns()).len(),
        1,
        "only the server's host veth"
    );

    stop_ctr(&mut server.0);
    let status = server.0.try_wait();
    assert!(
        matches!(status, Ok(Some(s)) if s.success()),
        "ctr run of the server: {status:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_nothing_left(&node, &cd, &before, "after ctr run --rm --cni");
}
