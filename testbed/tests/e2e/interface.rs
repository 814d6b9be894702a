//! ADD through the real plugin: the Result agrees with the kernel (addresses, routes, MACs,
//! MTU, host veth), the documented sysctls and nothing else change, an IPv4-only pod gives
//! the node no IPv6 state, and every refusal leaves the node, the pod and the store as
//! they were.

use std::{collections::BTreeSet, path::Path};

use serde_json::json;
use testbed::{
    assert_ping,
    inspect::{
        global_addresses, host_alias, host_veths, is_host_veth_name, link, main_routes,
        net_sysctls, sysctl, RouteInfo,
    },
    process::{ip_json, netns_exec_ok},
    SimNode,
};

const GW4: &str = "10.244.1.1";
const GW6: &str = "fd00:10:244:1::1";

/// The routes a test installed (anything the kernel did not add itself), as
/// `(dst, gateway, scope)`.
fn installed(
    routes: &[RouteInfo],
    dev: &str,
) -> BTreeSet<(String, Option<String>, Option<String>)> {
    routes
        .iter()
        .filter(|r| r.dev.as_deref() == Some(dev) && r.protocol.as_deref() != Some("kernel"))
        .map(|r| (r.dst.clone(), r.gw.clone(), r.scope.clone()))
        .collect()
}

/// The sysctl changes an ADD may make: forwarding (node-wide, documented), what the kernel
/// itself changes with `ip_forward` (`conf.all.accept_redirects` = !forwarding, see
/// `inet_forward_change`), and the per-device entries of the new host veth.
fn allowed_sysctl_change(key: &str, host: &str) -> bool {
    key == "net.ipv4.ip_forward"
        || key == "net.ipv4.conf.all.accept_redirects"
        || (key.starts_with("net.ipv4.conf.") || key.starts_with("net.ipv6.conf."))
            && key.ends_with(".forwarding")
        || key.split('.').any(|part| part == host)
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn result_agrees_with_the_kernel_and_only_documented_sysctls_change() {
    let node = SimNode::new("result_kernel");
    let pod = node.pod("p");
    let mac = "0a:58:0a:f4:01:99";
    let dns = json!({ "nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"] });
    let conf = node
        .conf()
        .version("1.1.0")
        .set("mtu", json!(1400))
        .set("dns", dns.clone())
        .set("runtimeConfig", json!({ "mac": mac }));

    // A fresh node: the first ADD may enable forwarding, nothing else node-wide.
    let sysctls_before = net_sysctls(node.netns());
    let pod_before = pod.snapshot();
    let r = node.add(&pod, "eth0", &conf);

    // Interfaces: host veth first (no sandbox), then eth0 in CNI_NETNS, both at mtu 1400.
    assert_eq!(r.interfaces.len(), 2, "{r}");
    let host = r.host_interface().clone();
    let (ctr_idx, ctr) = r.container_interface("eth0");
    let ctr = ctr.clone();
    assert_eq!(ctr_idx, 1, "{r}");
    assert!(
        is_host_veth_name(&host.name),
        "host veth name {:?}",
        host.name
    );
    assert_eq!(
        ctr.mac.as_deref(),
        Some(mac),
        "runtimeConfig.mac not honoured: {r}"
    );
    assert_eq!((host.mtu, ctr.mtu), (Some(1400), Some(1400)), "{r}");
    assert_eq!(r.dns, dns, "dns of the configuration: {r}");

    let Some(h) = link(node.netns(), &host.name) else {
        panic!("host veth {} is not in the node", host.name)
    };
    let Some(c) = link(pod.netns(), "eth0") else {
        panic!("eth0 is not in the pod")
    };
    assert_eq!(h.kind.as_deref(), Some("veth"), "{:?}", h.raw);
    assert_eq!(
        Some(h.mac.as_str()),
        host.mac.as_deref(),
        "host MAC vs result"
    );
    assert_eq!(c.mac, mac, "container MAC in the kernel");
    assert_eq!((h.mtu, c.mtu), (1400, 1400), "MTU of both veth ends");
    assert!(h.up && c.up, "both ends up: {:?} {:?}", h.raw, c.raw);
    assert_eq!(c.peer_index, Some(h.index), "eth0's peer is the host veth");
    assert_eq!(
        h.alias.as_deref(),
        Some(host_alias("testnet", pod.container_id(), "eth0").as_str()),
        "host veth alias"
    );
    let pod_links: Vec<String> = testbed::inspect::links(pod.netns())
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(pod_links, ["lo", "eth0"], "links in the pod");

    // Addresses: the pod's as host routes (/32, /128, IPv6 without DAD); the host veth
    // owns the gateways.
    let (ip4, ip6) = (r.ip4(), r.ip6());
    for ip in &r.ips {
        assert_eq!(ip.interface, Some(1), "{r}");
        let gw = if ip.is_v6() { GW6 } else { GW4 };
        assert_eq!(ip.gateway.as_deref(), Some(gw), "{r}");
    }
    let mut want = vec![format!("{ip4}/32"), format!("{ip6}/128")];
    want.sort();
    assert_eq!(global_addresses(pod.netns(), "eth0"), want, "pod addresses");
    for a in testbed::inspect::addresses(pod.netns(), "eth0") {
        if a.local == ip6 {
            assert!(
                a.flag("nodad") && !a.flag("tentative") && !a.flag("dadfailed"),
                "the pod's IPv6 address must skip DAD: {}",
                a.raw
            );
        }
    }
    let mut want_gw = vec![format!("{GW4}/32"), format!("{GW6}/128")];
    want_gw.sort();
    assert_eq!(
        global_addresses(node.netns(), &host.name),
        want_gw,
        "gateway addresses on the host veth"
    );

    // Routes in the pod: gateway on-link, default via gateway, per family; the Result's
    // routes are exactly those defaults.
    let got = installed(&main_routes(pod.netns()), "eth0");
    let want: BTreeSet<_> = [
        (format!("{GW4}/32"), None, Some("link".to_owned())),
        ("0.0.0.0/0".to_owned(), Some(GW4.to_owned()), None),
        (format!("{GW6}/128"), None, None),
        ("::/0".to_owned(), Some(GW6.to_owned()), None),
    ]
    .into_iter()
    .collect();
    // IPv6 routes have no scope in `ip -j` output; compare IPv4 scope, ignore IPv6's.
    let strip = |s: &BTreeSet<(String, Option<String>, Option<String>)>| -> BTreeSet<_> {
        s.iter()
            .map(|(d, g, sc)| {
                (
                    d.clone(),
                    g.clone(),
                    if d.contains(':') { None } else { sc.clone() },
                )
            })
            .collect()
    };
    assert_eq!(strip(&got), want, "routes in the pod");
    let result_routes: BTreeSet<(String, Option<String>)> = r
        .routes
        .iter()
        .map(|x| (x.dst.clone(), x.gw.clone()))
        .collect();
    let want_routes: BTreeSet<(String, Option<String>)> = [
        ("0.0.0.0/0".to_owned(), Some(GW4.to_owned())),
        ("::/0".to_owned(), Some(GW6.to_owned())),
    ]
    .into_iter()
    .collect();
    assert_eq!(result_routes, want_routes, "Result routes: {r}");

    // Node: one host route per pod address via the host veth, proto 206, and nothing
    // else installed.
    let node_routes = main_routes(node.netns());
    let got: BTreeSet<_> = node_routes
        .iter()
        .filter(|r| r.protocol.as_deref() != Some("kernel") && r.dev.as_deref() == Some(&host.name))
        .map(|r| (r.dst.clone(), r.protocol.clone()))
        .collect();
    let want: BTreeSet<_> = [
        (format!("{ip4}/32"), Some("206".to_owned())),
        (format!("{ip6}/128"), Some("206".to_owned())),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want, "node routes to the pod");

    // Sysctls: forwarding on, accept_ra off on the host veth, nothing else touched.
    assert_eq!(
        sysctl(node.netns(), "net.ipv4.ip_forward").as_deref(),
        Some("1")
    );
    assert_eq!(
        sysctl(node.netns(), "net.ipv6.conf.all.forwarding").as_deref(),
        Some("1")
    );
    assert_eq!(
        sysctl(
            node.netns(),
            &format!("net.ipv6.conf.{}.accept_ra", host.name)
        )
        .as_deref(),
        Some("0"),
        "accept_ra of the host veth"
    );
    assert_eq!(
        sysctl(
            node.netns(),
            &format!("net.ipv6.conf.{}.disable_ipv6", host.name)
        )
        .as_deref(),
        Some("0"),
        "IPv6 on the host veth of a pod with an IPv6 address"
    );
    let sysctls_after = net_sysctls(node.netns());
    let changed: Vec<String> = sysctls_before
        .keys()
        .chain(sysctls_after.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|k| sysctls_before.get(*k) != sysctls_after.get(*k))
        .filter(|k| !allowed_sysctl_change(k, &host.name))
        .map(|k| {
            format!(
                "{k}: {:?} -> {:?}",
                sysctls_before.get(k),
                sysctls_after.get(k)
            )
        })
        .collect();
    assert!(
        changed.is_empty(),
        "ADD changed sysctls it does not document:\n{}",
        changed.join("\n")
    );

    // It works, and CHECK agrees right away.
    assert_ping(pod.netns(), GW4);
    assert_ping(pod.netns(), GW6);
    node.check(&pod, "eth0", &conf, &r.raw)
        .assert_empty_success();

    node.del(&pod, "eth0", &conf);
    pod.snapshot().assert_same_as(&pod_before);
    assert!(
        host_veths(node.netns()).is_empty(),
        "host veth left after DEL"
    );
    node.store("testnet").assert_empty("after DEL");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn an_ipv4_only_pods_host_veth_gives_the_node_no_ipv6_state() {
    let node = SimNode::new("v4only");
    let pod = node.pod("p");
    let conf = node.conf().version("1.1.0").subnets(&["10.244.1.0/24"]);
    let r = node.add(&pod, "eth0", &conf);
    let host = r.host_interface().name.clone();
    assert_eq!(
        sysctl(node.netns(), &format!("net.ipv6.conf.{host}.disable_ipv6")).as_deref(),
        Some("1"),
        "IPv6 on the host veth of an IPv4-only pod"
    );
    // No link-local address, and no route of any IPv6 table (main, local, multicast)
    // through it.
    let addrs = ip_json(node.netns(), &["-6", "addr", "show", "dev", &host]);
    assert!(
        addrs.as_array().is_none_or(|a| a
            .iter()
            .all(|l| l["addr_info"].as_array().is_none_or(Vec::is_empty))),
        "IPv6 addresses on {host}: {addrs}"
    );
    let routes = ip_json(
        node.netns(),
        &["-6", "route", "show", "table", "all", "dev", &host],
    );
    assert!(
        routes.as_array().is_none_or(Vec::is_empty),
        "IPv6 routes through {host}: {routes}"
    );
    // IPv4 is untouched: the pod reaches its gateway and CHECK agrees.
    assert_ping(pod.netns(), GW4);
    node.check(&pod, "eth0", &conf, &r.raw)
        .assert_empty_success();
    node.del(&pod, "eth0", &conf);
    assert!(
        host_veths(node.netns()).is_empty(),
        "host veth left after DEL"
    );
    node.store("testnet").assert_empty("after DEL");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn ipam_routes_and_the_cni_args_mac_are_installed() {
    let node = SimNode::new("ipam_routes");
    let pod = node.pod("p");
    let conf = node.conf().version("1.0.0").ipam(json!({
        "ranges": [[{ "subnet": "10.244.1.0/24" }], [{ "subnet": "fd00:10:244:1::/64" }]],
        "routes": [{ "dst": "10.96.0.0/12" }, { "dst": "fd00:96::/108" }],
    }));
    let mac = "0a:58:00:00:00:42";
    let env = pod
        .env("eth0")
        .with_args(&format!("IgnoreUnknown=1;MAC={mac}"));
    let r = testbed::ResultView::parse(&node.exec_plugin("ADD", &env, &conf.plugin()).result());

    let result_routes: BTreeSet<(String, Option<String>)> = r
        .routes
        .iter()
        .map(|x| (x.dst.clone(), x.gw.clone()))
        .collect();
    let want: BTreeSet<(String, Option<String>)> = [
        ("10.96.0.0/12".to_owned(), Some(GW4.to_owned())),
        ("fd00:96::/108".to_owned(), Some(GW6.to_owned())),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        result_routes, want,
        "ipam.routes with the gateway filled in: {r}"
    );
    let installed: BTreeSet<(String, Option<String>)> =
        installed(&main_routes(pod.netns()), "eth0")
            .into_iter()
            .filter(|(_, gw, _)| gw.is_some())
            .map(|(d, g, _)| (d, g))
            .collect();
    assert_eq!(
        installed, want,
        "routes via the gateway in the pod (no default route)"
    );

    let (_, ctr) = r.container_interface("eth0");
    assert_eq!(ctr.mac.as_deref(), Some(mac), "CNI_ARGS MAC: {r}");
    let Some(c) = link(pod.netns(), "eth0") else {
        panic!("no eth0 in the pod")
    };
    assert_eq!(c.mac, mac);
    node.check(&pod, "eth0", &conf, &r.raw)
        .assert_empty_success();
    node.del(&pod, "eth0", &conf);
    node.store("testnet").assert_empty("after DEL");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn every_route_field_the_result_reports_is_applied_or_refused() {
    // 1.1.0 routes carry mtu, advmss, priority, table and scope. Each one the Result
    // reports must be what the kernel holds, and CHECK must look where the route went.
    let node = SimNode::new("route_fields");
    let pod = node.pod("p");
    let conf = node.conf().version("1.1.0").ipam(json!({
        "ranges": [[{ "subnet": "10.244.1.0/24" }]],
        "routes": [
            { "dst": "0.0.0.0/0" },
            { "dst": "192.0.2.0/24", "mtu": 1400, "advmss": 1300, "priority": 7, "table": 100 },
            { "dst": "198.51.100.0/24", "scope": 0, "priority": 9 },
        ],
    }));
    let out = node.exec_plugin("ADD", &pod.env("eth0"), &conf.plugin());
    let result = out.result();
    let routes = result["routes"].as_array().cloned().unwrap_or_default();
    let r100 = routes
        .iter()
        .find(|r| r["dst"] == "192.0.2.0/24")
        .unwrap_or_else(|| panic!("no 192.0.2.0/24 route in the Result: {result}"));
    assert_eq!(
        (
            &r100["mtu"],
            &r100["advmss"],
            &r100["priority"],
            &r100["table"]
        ),
        (&json!(1400), &json!(1300), &json!(7), &json!(100)),
        "the Result echoes the route fields: {result}"
    );
    // The kernel holds them: table 100, with its metrics.
    let live = testbed::ip_json(pod.netns(), &["-4", "-d", "route", "show", "table", "100"]);
    let live = live.as_array().cloned().unwrap_or_default();
    let Some(l) = live.iter().find(|r| r["dst"] == "192.0.2.0/24") else {
        panic!("192.0.2.0/24 is not in table 100 of the pod: {live:?}")
    };
    assert_eq!(l["gateway"], GW4, "{l}");
    assert_eq!(l["metric"], 7, "{l}");
    let metrics = l["metrics"].as_array().cloned().unwrap_or_default();
    let has = |k: &str, v: u64| metrics.iter().any(|m| m[k] == v);
    assert!(
        has("mtu", 1400) && has("advmss", 1300),
        "route metrics: {l}"
    );
    let main = testbed::ip_json(pod.netns(), &["-4", "route", "show", "table", "main"]);
    assert!(
        !main
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["dst"] == "192.0.2.0/24"),
        "the table-100 route must not also be in main: {main}"
    );
    assert!(
        main.as_array()
            .into_iter()
            .flatten()
            .any(|r| r["dst"] == "198.51.100.0/24" && r["metric"] == 9),
        "198.51.100.0/24 metric 9 in main: {main}"
    );
    node.check(&pod, "eth0", &conf, &result)
        .assert_empty_success();

    // CHECK looks in the route's own table: gone from table 100 = a failed CHECK naming it.
    netns_exec_ok(
        pod.netns(),
        &["ip", "route", "del", "192.0.2.0/24", "table", "100"],
    );
    let e = node.check(&pod, "eth0", &conf, &result).error();
    assert!(
        e.msg.contains("192.0.2.0/24") || e.details.contains("192.0.2.0/24"),
        "CHECK names the missing route: {e:?}"
    );
    assert!(
        e.details.contains("table 100") || e.msg.contains("table 100"),
        "{e:?}"
    );
    node.del(&pod, "eth0", &conf);

    // A scope the kernel cannot hold is refused, naming the field, and changes nothing.
    let bad = node.conf().version("1.1.0").ipam(json!({
        "ranges": [[{ "subnet": "10.244.1.0/24" }]],
        "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "192.0.2.0/24", "scope": 300 }],
    }));
    let pod2 = node.pod("q");
    let (node_before, pod_before) = (node.snapshot(), pod2.snapshot());
    let e = node
        .exec_plugin("ADD", &pod2.env("eth0"), &bad.plugin())
        .assert_error(7);
    assert!(
        format!("{} {}", e.msg, e.details).contains("ipam.routes[1].scope"),
        "the error names the field: {e:?}"
    );
    assert_untouched(&node, "scope 300", &node_before, &pod2, &pod_before);
    node.store("testnet")
        .assert_empty("after DEL and a refused ADD");
}

/// Asserts that a refused ADD changed nothing: node, pod, store, host veths.
#[track_caller]
fn assert_untouched(
    node: &SimNode,
    what: &str,
    node_before: &testbed::Snapshot,
    pod: &testbed::Pod,
    pod_before: &testbed::Snapshot,
) {
    node.snapshot().assert_same_as(node_before);
    pod.snapshot().assert_same_as(pod_before);
    assert!(
        host_veths(node.netns()).is_empty(),
        "{what}: a host veth was created"
    );
    let store = node.store("testnet");
    assert!(
        !store.has_key(pod.container_id(), "eth0") && store.ips.is_empty(),
        "{what}: an address was reserved: {store:?}"
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn add_refuses_an_existing_interface_and_bad_namespaces_and_changes_nothing() {
    let node = SimNode::new("add_refusals");
    let conf = node.conf();
    let pod = node.pod("p");
    let node_before = node.snapshot();

    // An interface named CNI_IFNAME already exists in the container.
    netns_exec_ok(
        pod.netns(),
        &[
            "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
        ],
    );
    let pod_before = pod.snapshot();
    let e = node
        .exec_plugin("ADD", &pod.env("eth0"), &conf.plugin())
        .assert_error(105);
    assert!(
        e.msg.contains("eth0") || e.details.contains("eth0"),
        "{e:?}"
    );
    assert_untouched(&node, "existing eth0", &node_before, &pod, &pod_before);

    // Namespaces that are not a pod's network namespace: error 4 naming CNI_NETNS.
    let file = node.dir().join("not-a-netns");
    std::fs::write(&file, b"").ok();
    let cases: [(&str, &Path); 5] = [
        ("the node's own namespace", node.netns()),
        ("a regular file", &file),
        ("a mount namespace", Path::new("/proc/self/ns/mnt")),
        (
            "a missing path",
            Path::new("/run/netns/cni-ebpf-test-does-not-exist"),
        ),
        ("an empty CNI_NETNS", Path::new("")),
    ];
    let pod_before = pod.snapshot();
    for (what, path) in cases {
        let env = pod.env("eth1").with_netns(path);
        let out = node.exec_plugin("ADD", &env, &conf.plugin());
        let e = out.error();
        assert_eq!(e.code, 4, "{what}: {}", out.raw);
        assert!(
            e.msg.contains("CNI_NETNS") || e.details.contains("CNI_NETNS"),
            "{what}: the error should name CNI_NETNS: {e:?}"
        );
        assert_untouched(&node, what, &node_before, &pod, &pod_before);
    }
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn add_refuses_a_taken_host_veth_name_and_changes_nothing() {
    let node = SimNode::new("taken_name");
    let conf = node.conf();
    node.warm_up(&conf);
    let pod = node.pod("p");
    // Learn the host veth name of (pod, eth0), then take it with a foreign link.
    let r = node.add(&pod, "eth0", &conf);
    let host = r.host_interface().name.clone();
    node.del(&pod, "eth0", &conf);
    node.exec(&[
        "ip", "link", "add", &host, "type", "veth", "peer", "name", "foreign0",
    ])
    .ok();
    let node_before = node.snapshot();
    let pod_before = pod.snapshot();
    let e = node
        .exec_plugin("ADD", &pod.env("eth0"), &conf.plugin())
        .assert_error(105);
    assert!(e.msg.contains(&host) || e.details.contains(&host), "{e:?}");
    node.snapshot().assert_same_as(&node_before);
    pod.snapshot().assert_same_as(&pod_before);
    node.store("testnet").assert_empty("after a refused ADD");
    // DEL must not delete a link whose alias does not name the attachment.
    node.del(&pod, "eth0", &conf);
    assert!(
        link(node.netns(), &host).is_some(),
        "DEL deleted a foreign link that merely has the host veth's name"
    );
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn add_with_prev_result_appends_to_it() {
    // cni-ebpf chained after another plugin: its interfaces and addresses are appended,
    // with `interface` indexes shifted past the earlier ones.
    let node = SimNode::new("prev_result");
    let pod = node.pod("p");
    let prev = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{ "name": "lo", "sandbox": pod.netns() }],
        "ips": [{ "address": "127.0.0.1/8", "interface": 0 }],
        "dns": { "nameservers": ["192.0.2.53"] },
    });
    let conf = node.conf().set("prevResult", prev);
    let r = node.add(&pod, "eth0", &conf);
    let names: Vec<&str> = r.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names.len(), 3, "{r}");
    assert_eq!(names[0], "lo", "prevResult's interfaces come first: {r}");
    assert!(is_host_veth_name(names[1]) && names[2] == "eth0", "{r}");
    assert_eq!(
        r.ips[0].address, "127.0.0.1/8",
        "prevResult's ips come first: {r}"
    );
    for ip in &r.ips[1..] {
        assert_eq!(
            ip.interface,
            Some(2),
            "our ips point at eth0 (index 2): {r}"
        );
    }
    assert_eq!(r.ips.len(), 3, "{r}");
    assert_eq!(
        r.dns["nameservers"],
        json!(["192.0.2.53"]),
        "prevResult's dns kept: {r}"
    );
    node.check(&pod, "eth0", &node.conf(), &r.raw)
        .assert_empty_success();
    node.del(&pod, "eth0", &node.conf());
    node.store("testnet").assert_empty("after DEL");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn two_networks_in_one_pod_are_independent_attachments() {
    // Multus-style: eth0 on the default network, eth1 on a second one whose routes cover
    // only its own prefix. Attachments are keyed by (container ID, ifname) and network.
    let node = SimNode::new("two_ifs");
    let pod = node.pod("p");
    let conf = node.conf();
    let conf2 = node.conf().name("net2").ipam(json!({
        "ranges": [[{ "subnet": "10.245.1.0/24" }], [{ "subnet": "fd00:10:245:1::/64" }]],
        "routes": [{ "dst": "10.245.0.0/16" }, { "dst": "fd00:10:245::/48" }],
    }));
    let r0 = node.add(&pod, "eth0", &conf);
    let r1 = node.add(&pod, "eth1", &conf2);
    assert_ne!(
        r0.host_interface().name,
        r1.host_interface().name,
        "one host veth per (container ID, ifname)"
    );
    assert!(r1.ip4().starts_with("10.245.1."), "{r1}");
    assert!(node.store("testnet").has_key(pod.container_id(), "eth0"));
    assert!(node.store("net2").has_key(pod.container_id(), "eth1"));
    node.check(&pod, "eth0", &conf, &r0.raw)
        .assert_empty_success();
    node.check(&pod, "eth1", &conf2, &r1.raw)
        .assert_empty_success();
    assert_ping(pod.netns(), "10.245.1.1");
    assert_ping(pod.netns(), "10.244.1.1");

    // A second interface on the *same* network: the spec does not require it to work,
    // but if it fails it must fail cleanly and leave eth0 alone.
    // The kernel's duplicate address detection of eth0's link-local address may still
    // be under way (its `tentative` flag and local route change on their own): wait for
    // it (bounded) so that the snapshots compare only what the failed ADD could change.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline
        && pod
            .exec(&["ip", "-6", "addr", "show", "tentative"])
            .stdout
            .contains("inet6")
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let before = node.snapshot();
    let pod_before = pod.snapshot();
    let out = node.exec_plugin("ADD", &pod.env("eth2"), &conf.plugin());
    if out.success() {
        node.del(&pod, "eth2", &conf);
    } else {
        node.snapshot().assert_same_as(&before);
        pod.snapshot().assert_same_as(&pod_before);
        assert!(
            !node.store("testnet").has_key(pod.container_id(), "eth2"),
            "a failed ADD of eth2 kept its reservation"
        );
    }

    // DEL of eth1 leaves eth0 whole.
    node.del(&pod, "eth1", &conf2);
    assert!(link(pod.netns(), "eth1").is_none(), "eth1 survived its DEL");
    assert!(
        link(node.netns(), &r1.host_interface().name).is_none(),
        "eth1's host veth survived its DEL"
    );
    node.store("net2").assert_empty("after DEL of eth1");
    node.check(&pod, "eth0", &conf, &r0.raw)
        .assert_empty_success();
    assert_ping(node.netns(), &r0.ip4());
    node.del(&pod, "eth0", &conf);
    node.store("testnet").assert_empty("after both DELs");
}

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn an_unknown_configuration_key_is_logged_naming_it() {
    // A misspelt key silently falls back to its default: the operator must see it.
    let node = SimNode::new("unknown_key");
    let pod = node.pod("p");
    let conf = node.conf().set("ipMasquerade", json!(true));
    let out = node.exec_plugin("ADD", &pod.env("eth0"), &conf.plugin());
    assert!(
        out.success(),
        "an unknown key must not fail ADD: {}",
        out.raw
    );
    let log = node.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("\"ipMasquerade\"")),
        "no warning naming ipMasquerade in the log:\n{log}"
    );
    assert!(
        !log.contains("\"cniVersion\" is ignored") && !log.contains("\"bpffsRoot\" is ignored"),
        "known keys reported as unknown:\n{log}"
    );
    node.del(&pod, "eth0", &conf);
}
