//! The attach path on real interfaces, inside a private network namespace: loading with
//! the uplink found from the default route, clsact filters (`attach: "tc"`) or tcx links
//! (`"tcx"`) on a host veth and the uplink, switching between the two, CHECK noticing
//! each kind of damage, DEL, STATUS. No packet is sent anywhere.
//! Root and the eBPF object are needed: run through `cargo xtask test`.

use std::{path::PathBuf, process::Command};

use cni_ebpf::{
    cni::{
        config::{AttachPolicy, NetConf},
        env::Command as Verb,
    },
    datapath::{Datapath, Endpoint},
    kernel::netns::Netns,
    Error,
};
use testbed::packet::*;

/// A network namespace created with `ip netns add`, deleted on drop.
struct TestNs {
    name: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestNs {
    fn new(tag: &str) -> Self {
        let name = format!("cnidp-{tag}-{}", std::process::id());
        ip(&["netns", "add", &name]);
        Self { name }
    }
    fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }
    fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all);
    }
    fn tc(&self, args: &[&str]) -> String {
        let out = Command::new("tc")
            .args(["-n", &self.name])
            .args(args)
            .output()
            .expect("running tc");
        assert!(
            out.status.success(),
            "tc {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    /// The `bpf` filters on `dev`'s `hook` (ingress/egress) as (priority, handle, id).
    fn bpf_filters(&self, dev: &str, hook: &str) -> Vec<(u64, String, u64)> {
        let out = self.tc(&["-j", "filter", "show", "dev", dev, hook]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        v.as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["kind"] == "bpf" && f["options"]["handle"].is_string())
            .map(|f| {
                (
                    f["pref"].as_u64().unwrap_or(0),
                    f["options"]["handle"].as_str().unwrap_or("").to_owned(),
                    f["options"]["prog"]["id"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    }
    fn ifindex(&self, dev: &str) -> u32 {
        let out = Command::new("ip")
            .args(["-n", &self.name, "-o", "link", "show", dev])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split(':')
            .next()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("no ifindex for {dev}"))
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn conf(bpffs_root: &std::path::Path) -> NetConf {
    let json = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "net",
        "type": "cni-ebpf",
        "ipMasq": true,
        "clusterCIDRs": ["10.244.0.0/16"],
        "bpffsRoot": bpffs_root,
        // Not on the machine's cgroup2 root (tested with a cgroup of its own end to end).
        "cgroupPath": "",
    });
    NetConf::parse(json.to_string().as_bytes(), Verb::Add).unwrap_or_else(|e| panic!("conf: {e}"))
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn attach_check_detach_with_clsact_filters() {
    attach_check_detach(AttachPolicy::Tc, "tc");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn attach_check_detach_with_tcx_links() {
    attach_check_detach(AttachPolicy::Tcx, "tcx");
}

fn attach_check_detach(policy: AttachPolicy, tag: &str) {
    // A private bpffs (from the fixture, whose own load we do not use) and a node netns.
    let fx = Fixture::new();
    let root = fx.network_dir().parent().unwrap().to_path_buf();
    let ns = TestNs::new(tag);
    ns.ip(&["link", "set", "lo", "up"]);
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"]);
    ns.ip(&["addr", "add", "198.18.0.2/24", "dev", "up0"]);
    ns.ip(&["link", "set", "up0", "up"]);
    ns.ip(&["link", "set", "up1", "up"]);
    ns.ip(&["route", "add", "default", "via", "198.18.0.1", "dev", "up0"]);
    ns.ip(&[
        "link",
        "add",
        "hv0",
        "address",
        "02:00:00:00:0a:01",
        "type",
        "veth",
        "peer",
        "name",
        "pv0",
    ]);
    ns.ip(&["addr", "add", "10.244.1.1/32", "dev", "hv0"]);
    ns.ip(&["link", "set", "hv0", "up"]);
    let hv0 = ns.ifindex("hv0");
    let up0 = ns.ifindex("up0");

    let node = Netns::open(&ns.path()).unwrap();
    let _in_node = node.enter().unwrap();
    let mut conf = conf(&root);
    conf.attach = policy;
    Datapath::status(&conf).expect("the fixture loaded the pins already");

    let dp = Datapath::open_or_load(&conf).unwrap_or_else(|e| panic!("open_or_load: {e}"));
    let view = dp.node_config_view().unwrap();
    assert_eq!(view.uplink_ifindex, up0, "uplink from the default route");
    assert_eq!(view.node_addr, Some("198.18.0.2".parse().unwrap()));
    assert!(view.ip_masq);
    assert_eq!(view.cluster_cidrs, vec!["10.244.0.0/16".to_owned()]);
    assert!(
        view.node_addrs.contains(&"10.244.1.1".parse().unwrap()),
        "gateway address is a node address"
    );
    let fwd = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap();
    assert_eq!(fwd.trim(), "1", "forwarding enabled in the node namespace");

    let ep = Endpoint {
        container_id: "ctr-attach".into(),
        ifname: "eth0".into(),
        host_ifindex: hv0,
        host_ifname: "hv0".into(),
        host_mac: [0x02, 0, 0, 0, 0x0a, 0x01],
        pod_mac: POD_MAC_A,
        ips: vec![POD_A.into(), "fd00::2".parse().unwrap()],
        allowed_sources: Vec::new(),
        nat_flows: cni_ebpf_common::DEFAULT_NAT_FLOWS_PER_POD,
        egress_rate: None,
        host_ports: false,
        netkit: false,
        pod: None,
    };
    dp.attach_endpoint(&ep)
        .unwrap_or_else(|e| panic!("attach_endpoint: {e}"));
    dp.check_endpoint(&ep, &[])
        .unwrap_or_else(|e| panic!("check after attach: {e}"));
    let from_pod = dp.program("from_pod").unwrap().info().unwrap().id();
    let ours = (1, "0xcb0f".to_owned(), u64::from(from_pod));
    match policy {
        AttachPolicy::Tcx => {
            assert!(dp.pins().endpoint_link("hv0").exists(), "tcx link pinned");
            assert!(ns.bpf_filters("hv0", "ingress").is_empty());
        }
        _ => {
            assert!(!dp.pins().endpoint_link("hv0").exists(), "no tcx pin");
            assert_eq!(ns.bpf_filters("hv0", "ingress"), vec![ours.clone()]);
            assert_eq!(ns.bpf_filters("up0", "ingress").len(), 1, "uplink ingress");
            assert_eq!(ns.bpf_filters("up0", "egress").len(), 1, "uplink egress");
        }
    }
    // Attaching again replaces in place: still exactly one attachment.
    dp.attach_endpoint(&ep).unwrap();
    dp.check_endpoint(&ep, &[]).unwrap();
    if policy == AttachPolicy::Tc {
        assert_eq!(ns.bpf_filters("hv0", "ingress"), vec![ours.clone()]);
    }

    // A second open_or_load does not load again and keeps the uplink links.
    let id = |d: &Datapath| d.program("uplink_ingress").unwrap().info().unwrap().id();
    let before = id(&dp);
    let dp2 = Datapath::open_or_load(&conf).unwrap();
    assert_eq!(id(&dp2), before);
    drop(dp2);

    // CHECK notices each kind of damage.
    let mut wrong = ep.clone();
    wrong.pod_mac = POD_MAC_B;
    let e = dp.check_endpoint(&wrong, &[]).unwrap_err();
    assert!(
        matches!(e, Error::Check(ref m) if m.contains("pod MAC")),
        "{e}"
    );
    let pms = [cni_ebpf::cni::config::PortMapping {
        host_port: 8080,
        container_port: 80,
        protocol: "tcp".into(),
        host_ip: None,
    }];
    let e = dp.check_endpoint(&ep, &pms).unwrap_err();
    assert!(
        matches!(e, Error::Check(ref m) if m.contains("8080") && m.contains("missing")),
        "{e}"
    );
    dp.add_port_mappings(("ctr-attach", "eth0"), &ep.ips, &pms)
        .unwrap();
    dp.check_endpoint(&ep, &pms).unwrap();
    let e = dp.check_endpoint(&ep, &[]).unwrap_err();
    assert!(
        matches!(e, Error::Check(ref m) if m.contains("unexpected port mapping")),
        "{e}"
    );
    dp.remove_port_mappings(("ctr-attach", "eth0")).unwrap();

    // The program removed from the host veth the way each mode can lose it.
    match policy {
        AttachPolicy::Tcx => std::fs::remove_file(dp.pins().endpoint_link("hv0")).unwrap(),
        _ => {
            ns.tc(&["qdisc", "del", "dev", "hv0", "clsact"]);
        }
    }
    // The kernel frees an unpinned link asynchronously, so CHECK sees either the missing
    // pin or the already detached program; both name this damage.
    let e = dp.check_endpoint(&ep, &[]).unwrap_err();
    assert!(
        matches!(e, Error::Check(ref m) if m.contains("not attached")),
        "{e}"
    );
    dp.attach_endpoint(&ep).unwrap();
    dp.check_endpoint(&ep, &[]).unwrap();

    dp.detach_endpoint("ctr-attach", "eth0", "hv0", &[])
        .unwrap();
    let e = dp.check_endpoint(&ep, &[]).unwrap_err();
    assert!(
        matches!(e, Error::Check(ref m) if m.contains("no entry")),
        "{e}"
    );
    assert!(!dp.pins().endpoint_link("hv0").exists(), "link pin removed");
    assert!(dp.endpoints().unwrap().is_empty());
    assert!(dp.attachments().unwrap().is_empty(), "owner record gone");
    dp.detach_endpoint("ctr-attach", "eth0", "hv0", &[])
        .unwrap();

    // Uplink damage.
    dp.attach_endpoint(&ep).unwrap();
    match policy {
        AttachPolicy::Tcx => std::fs::remove_file(
            dp.pins()
                .uplink_link("up0", cni_ebpf::datapath::pins::Direction::Egress),
        )
        .unwrap(),
        _ => {
            ns.tc(&["filter", "del", "dev", "up0", "egress"]);
        }
    }
    let e = dp.check_endpoint(&ep, &[]).unwrap_err();
    assert!(
        matches!(e, Error::Check(ref m) if m.contains("uplink")),
        "{e}"
    );
    drop(dp);
    let dp = Datapath::open_or_load(&conf).unwrap();
    dp.check_endpoint(&ep, &[])
        .unwrap_or_else(|e| panic!("after re-load: {e}"));

    // The other mode takes over without the program ever running twice.
    let other = match policy {
        AttachPolicy::Tcx => AttachPolicy::Tc,
        _ => AttachPolicy::Tcx,
    };
    drop(dp);
    let mut conf2 = conf.clone();
    conf2.attach = other;
    let dp = Datapath::open_or_load(&conf2).unwrap();
    dp.attach_endpoint(&ep).unwrap();
    dp.check_endpoint(&ep, &[])
        .unwrap_or_else(|e| panic!("after switching to {other:?}: {e}"));
    let (filters, pinned) = (
        ns.bpf_filters("hv0", "ingress"),
        dp.pins().endpoint_link("hv0").exists(),
    );
    match other {
        AttachPolicy::Tcx => {
            assert!(filters.is_empty() && pinned, "{filters:?} {pinned}");
            assert!(
                ns.bpf_filters("up0", "egress").is_empty(),
                "uplink filter left"
            );
            // Damage: our filter added back by hand next to the tcx link.
            let prog_pin = dp.pins().prog("from_pod");
            let prog_pin = prog_pin.to_str().unwrap();
            ns.tc(&["qdisc", "replace", "dev", "hv0", "clsact"]);
            ns.tc(&[
                "filter",
                "add",
                "dev",
                "hv0",
                "ingress",
                "prio",
                "1",
                "handle",
                "0xcb0f",
                "bpf",
                "object-pinned",
                prog_pin,
                "da",
            ]);
            let e = dp.check_endpoint(&ep, &[]).unwrap_err();
            assert!(
                matches!(e, Error::Check(ref m) if m.contains("runs twice")),
                "{e}"
            );
            // Attaching again (tcx) removes the stray filter.
            dp.attach_endpoint(&ep).unwrap();
            dp.check_endpoint(&ep, &[]).unwrap();
            assert!(ns.bpf_filters("hv0", "ingress").is_empty());
        }
        _ => {
            assert_eq!(filters, vec![ours.clone()]);
            assert!(!pinned, "tcx pin left behind");
        }
    }
    dp.detach_endpoint("ctr-attach", "eth0", "hv0", &[])
        .unwrap();
    drop(dp);
    Datapath::unload_at(conf.pin_dir()).unwrap();
    let e = Datapath::status(&conf).unwrap_err();
    assert!(matches!(e, Error::NotAvailable(_)), "{e}");
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn status_without_bpffs_is_not_available() {
    let dir = tempfile::tempdir().unwrap();
    let conf = conf(dir.path());
    let e = Datapath::status(&conf).unwrap_err();
    assert!(
        matches!(e, Error::NotAvailable(ref m) if m.contains("bpf filesystem")),
        "{e}"
    );
    assert!(Datapath::open(&conf).unwrap().is_none());
}
