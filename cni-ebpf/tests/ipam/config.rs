//! The `ipam` configuration parser: every accepted form, the host-local defaults, small
//! subnets, and the refusals (each naming the offending field). No root, no filesystem.

use std::{fmt::Debug, net::IpAddr};

use crate::common::{env, parse};
use cni_ebpf::{
    cni::env::Command,
    error::Error,
    ipam::{
        config::{requested_ips, Range},
        Ipam, IpamConfig,
    },
};
use serde_json::{json, Value};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn embedded(ipam: Value) -> IpamConfig {
    match Ipam::parse(&ipam) {
        Ok(Ipam::Embedded(cfg)) => cfg,
        Ok(other) => panic!("{ipam} parsed as {other:?}"),
        Err(e) => panic!("{ipam} was refused: {e}"),
    }
}

/// Asserts `ipam` is refused with code 7 on `field`, with a reason containing `needle`.
fn refused(ipam: Value, field: &str, needle: &str) {
    config_error(Ipam::parse(&ipam), &ipam, field, needle);
}

/// Asserts `result` (of checking `what`) is error 7 on `field`, with a reason containing
/// `needle`.
fn config_error<T: Debug>(result: Result<T, Error>, what: &Value, field: &str, needle: &str) {
    match result {
        Err(e @ Error::InvalidConfig { .. }) => {
            let Error::InvalidConfig { field: got, reason } = &e else {
                unreachable!()
            };
            assert_eq!(e.code(), 7);
            assert_eq!(got, field, "wrong field for {what}: {e}");
            assert!(
                reason.contains(needle),
                "reason for {what} should mention {needle:?}: {reason}"
            );
        }
        Err(e) => panic!("{what} refused with the wrong error: {e}"),
        Ok(ok) => panic!("{what} was accepted: {ok:?}"),
    }
}

fn only_range(cfg: &IpamConfig) -> &Range {
    assert_eq!(cfg.range_sets.len(), 1, "{cfg:?}");
    assert_eq!(cfg.range_sets[0].ranges.len(), 1, "{cfg:?}");
    &cfg.range_sets[0].ranges[0]
}

#[test]
fn ipv4_defaults_follow_host_local() {
    let cfg = embedded(json!({"ranges": [[{"subnet": "10.1.0.0/24"}]]}));
    let r = only_range(&cfg);
    assert_eq!(r.subnet.to_string(), "10.1.0.0/24");
    // host-local: start at network+1 (the gateway, skipped when allocating), end at
    // broadcast-1, gateway network+1.
    assert_eq!(r.range_start, ip("10.1.0.1"));
    assert_eq!(r.range_end, ip("10.1.0.254"));
    assert_eq!(r.gateway, Some(ip("10.1.0.1")));
    assert!(cfg.routes.is_empty());
    assert!(cfg.dns.is_empty());
}

#[test]
fn ipv6_defaults_have_no_broadcast() {
    let cfg = embedded(json!({"ranges": [[{"subnet": "fd00:10::/64"}]]}));
    let r = only_range(&cfg);
    assert_eq!(r.range_start, ip("fd00:10::1"));
    assert_eq!(r.range_end, ip("fd00:10::ffff:ffff:ffff:ffff"));
    assert_eq!(r.gateway, Some(ip("fd00:10::1")));
}

#[test]
fn explicit_bounds_and_gateway() {
    let cfg = embedded(json!({"ranges": [[{
        "subnet": "10.1.0.0/16", "rangeStart": "10.1.2.10", "rangeEnd": "10.1.2.20",
        "gateway": "10.1.255.254"
    }]]}));
    let r = only_range(&cfg);
    assert_eq!(r.range_start, ip("10.1.2.10"));
    assert_eq!(r.range_end, ip("10.1.2.20"));
    assert_eq!(r.gateway, Some(ip("10.1.255.254")));
    assert_eq!(r.size(), 11);
}

#[test]
fn legacy_single_subnet_form() {
    let cfg = embedded(json!({
        "subnet": "192.168.7.0/24", "rangeStart": "192.168.7.100", "rangeEnd": "192.168.7.200",
        "gateway": "192.168.7.254"
    }));
    let r = only_range(&cfg);
    assert_eq!(r.subnet.to_string(), "192.168.7.0/24");
    assert_eq!(r.range_start, ip("192.168.7.100"));
    assert_eq!(r.range_end, ip("192.168.7.200"));
    assert_eq!(r.gateway, Some(ip("192.168.7.254")));
}

#[test]
fn legacy_subnet_comes_before_ranges() {
    let cfg = embedded(json!({
        "subnet": "10.3.0.0/24",
        "ranges": [[{"subnet": "fd00:3::/64"}]]
    }));
    assert_eq!(cfg.range_sets.len(), 2);
    assert_eq!(
        cfg.range_sets[0].ranges[0].subnet.to_string(),
        "10.3.0.0/24"
    );
    assert_eq!(
        cfg.range_sets[1].ranges[0].subnet.to_string(),
        "fd00:3::/64"
    );
}

#[test]
fn dual_stack_and_multi_range_sets() {
    let cfg = embedded(json!({
        "type": "cni-ebpf",
        "ranges": [
            [{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.19"},
             {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.50", "rangeEnd": "10.1.0.59"},
             {"subnet": "10.2.0.0/24"}],
            [{"subnet": "fd00:1::/64"}]
        ],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd00:1::1"}],
        "dns": {"nameservers": ["10.1.0.53"], "search": ["svc.local"]}
    }));
    assert_eq!(cfg.range_sets.len(), 2);
    assert_eq!(cfg.range_sets[0].ranges.len(), 3);
    assert_eq!(cfg.range_sets[0].range_for(ip("10.1.0.55")), Some(1));
    assert_eq!(cfg.range_sets[0].range_for(ip("10.1.0.30")), None);
    assert_eq!(cfg.routes.len(), 2);
    assert_eq!(cfg.routes[1].gw, Some(ip("fd00:1::1")));
    assert_eq!(cfg.dns.nameservers, vec!["10.1.0.53".to_owned()]);
}

#[test]
fn resolv_conf_fills_dns() {
    let dir = crate::common::data_dir();
    let path = dir.path().join("resolv.conf");
    std::fs::write(
        &path,
        "# comment\nnameserver 10.0.0.53\nnameserver fd00::53\ndomain example.com\n\
         search a.example b.example\noptions ndots:5 edns0\n",
    )
    .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    let doc = crate::common::netconf_json(
        dir.path(),
        json!({"ranges": [[{"subnet": "10.1.0.0/24"}]], "resolvConf": path}),
    );
    let conf = parse(&doc, Command::Add);
    let cfg = embedded(conf.ipam.clone());
    let dns = cfg
        .result_dns(&conf)
        .unwrap_or_else(|e| panic!("resolvConf: {e}"));
    assert_eq!(dns.nameservers, vec!["10.0.0.53", "fd00::53"]);
    assert_eq!(dns.domain.as_deref(), Some("example.com"));
    assert_eq!(dns.search, vec!["a.example", "b.example"]);
    assert_eq!(dns.options, vec!["ndots:5", "edns0"]);

    // ipam.dns wins over resolvConf.
    let doc = crate::common::netconf_json(
        dir.path(),
        json!({"ranges": [[{"subnet": "10.1.0.0/24"}]], "resolvConf": path,
               "dns": {"nameservers": ["1.1.1.1"]}}),
    );
    let conf = parse(&doc, Command::Add);
    let dns = embedded(conf.ipam.clone())
        .result_dns(&conf)
        .unwrap_or_else(|e| panic!("dns: {e}"));
    assert_eq!(dns.nameservers, vec!["1.1.1.1"]);
}

#[test]
fn other_types_are_delegated() {
    match Ipam::parse(&json!({"type": "host-local", "ranges": "not even checked"})) {
        Ok(Ipam::Delegate(name)) => assert_eq!(name, "host-local"),
        other => panic!("expected delegation, got {other:?}"),
    }
    refused(json!({"type": "../evil"}), "ipam.type", "not a plugin name");
}

#[test]
fn small_ipv4_subnets() {
    // /30: network, gateway, one address, broadcast.
    let r = only_range(&embedded(json!({"ranges": [[{"subnet": "10.0.0.4/30"}]]}))).clone();
    assert_eq!(
        (r.range_start, r.range_end),
        (ip("10.0.0.5"), ip("10.0.0.6"))
    );
    assert_eq!(r.gateway, Some(ip("10.0.0.5")));
    // /31: point-to-point, both usable, the lower is the gateway.
    let r = only_range(&embedded(json!({"ranges": [[{"subnet": "10.0.0.8/31"}]]}))).clone();
    assert_eq!(
        (r.range_start, r.range_end),
        (ip("10.0.0.8"), ip("10.0.0.9"))
    );
    assert_eq!(r.gateway, Some(ip("10.0.0.8")));
    // /31 with the upper as gateway.
    let r = only_range(&embedded(
        json!({"ranges": [[{"subnet": "10.0.0.8/31", "gateway": "10.0.0.9"}]]}),
    ))
    .clone();
    assert_eq!(r.gateway, Some(ip("10.0.0.9")));
    // /32: the one address, no gateway.
    let r = only_range(&embedded(json!({"ranges": [[{"subnet": "10.0.0.7/32"}]]}))).clone();
    assert_eq!(
        (r.range_start, r.range_end),
        (ip("10.0.0.7"), ip("10.0.0.7"))
    );
    assert_eq!(r.gateway, None);
    refused(
        json!({"ranges": [[{"subnet": "10.0.0.7/32", "gateway": "10.0.0.7"}]]}),
        "ipam.ranges[0][0].gateway",
        "single address",
    );
    // A /31 range narrowed to just its gateway has nothing to hand out.
    refused(
        json!({"ranges": [[{"subnet": "10.0.0.8/31", "rangeStart": "10.0.0.8",
                             "rangeEnd": "10.0.0.8"}]]}),
        "ipam.ranges[0][0]",
        "only the gateway",
    );
}

#[test]
fn small_ipv6_subnets() {
    let r = only_range(&embedded(json!({"ranges": [[{"subnet": "fd00::a/127"}]]}))).clone();
    assert_eq!((r.range_start, r.range_end), (ip("fd00::a"), ip("fd00::b")));
    assert_eq!(r.gateway, Some(ip("fd00::a")));
    let r = only_range(&embedded(json!({"ranges": [[{"subnet": "fd00::5/128"}]]}))).clone();
    assert_eq!((r.range_start, r.range_end), (ip("fd00::5"), ip("fd00::5")));
    assert_eq!(r.gateway, None);
    refused(
        json!({"ranges": [[{"subnet": "fd00::5/128", "gateway": "fd00::5"}]]}),
        "ipam.ranges[0][0].gateway",
        "single address",
    );
}

#[test]
fn bad_subnets() {
    refused(
        json!({"ranges": [[{}]]}),
        "ipam.ranges[0][0].subnet",
        "required",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.0.0.0"}]]}),
        "ipam.ranges[0][0].subnet",
        "CIDR",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.0.0.0/33"}]]}),
        "ipam.ranges[0][0].subnet",
        "CIDR",
    );
    refused(
        json!({"ranges": [[{"subnet": "banana/24"}]]}),
        "ipam.ranges[0][0].subnet",
        "CIDR",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.0.0.1/24"}]]}),
        "ipam.ranges[0][0].subnet",
        "host bits set",
    );
    refused(
        json!({"ranges": [[{"subnet": "fd00::1/64"}]]}),
        "ipam.ranges[0][0].subnet",
        "fd00::/64",
    );
    refused(
        json!({"ranges": [[{"subnet": 10}]]}),
        "ipam.ranges[0][0].subnet",
        "",
    );
    refused(json!({"subnet": "10.0.0.0/8/8"}), "ipam.subnet", "CIDR");
}

#[test]
fn bounds_outside_the_subnet() {
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24"}, {"subnet": "10.2.0.0/24",
                            "rangeStart": "10.3.0.5"}]]}),
        "ipam.ranges[0][1].rangeStart",
        "outside subnet 10.2.0.0/24",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24", "rangeEnd": "10.1.1.5"}]]}),
        "ipam.ranges[0][0].rangeEnd",
        "outside subnet",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24", "gateway": "10.9.9.9"}]]}),
        "ipam.ranges[0][0].gateway",
        "outside subnet",
    );
    refused(
        json!({"subnet": "10.1.0.0/24", "gateway": "10.9.9.9"}),
        "ipam.gateway",
        "outside subnet",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24", "gateway": "fd00::1"}]]}),
        "ipam.ranges[0][0].gateway",
        "family",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24", "rangeStart": "nope"}]]}),
        "ipam.ranges[0][0].rangeStart",
        "not an IP address",
    );
}

#[test]
fn network_and_broadcast_are_never_bounds() {
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.0"}]]}),
        "ipam.ranges[0][0].rangeStart",
        "network address",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24", "rangeEnd": "10.1.0.255"}]]}),
        "ipam.ranges[0][0].rangeEnd",
        "broadcast",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24", "gateway": "10.1.0.255"}]]}),
        "ipam.ranges[0][0].gateway",
        "broadcast",
    );
    refused(
        json!({"ranges": [[{"subnet": "fd00::/64", "rangeStart": "fd00::"}]]}),
        "ipam.ranges[0][0].rangeStart",
        "anycast",
    );
}

#[test]
fn start_after_end() {
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.9",
                            "rangeEnd": "10.1.0.8"}]]}),
        "ipam.ranges[0][0].rangeStart",
        "after rangeEnd",
    );
}

#[test]
fn overlapping_ranges() {
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24"},
                           {"subnet": "10.1.0.0/25"}]]}),
        "ipam.ranges[0][1]",
        "overlaps ipam.ranges[0][0]",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.20"},
                           {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.20", "rangeEnd": "10.1.0.30"}]]}),
        "ipam.ranges[0][1]",
        "overlaps",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.1.0.0/16"}]]}),
        "ipam.ranges[1][0]",
        "range sets must not overlap",
    );
    refused(
        json!({"subnet": "10.1.0.0/24", "ranges": [[{"subnet": "10.1.0.128/25"}]]}),
        "ipam.ranges[0][0]",
        "overlaps ipam",
    );
    // Disjoint ranges of one subnet are fine.
    embedded(json!({"ranges": [[
        {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.19"},
        {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.20", "rangeEnd": "10.1.0.30"}]]}));
}

#[test]
fn mixed_families_in_one_set() {
    refused(
        json!({"ranges": [[{"subnet": "10.1.0.0/24"}, {"subnet": "fd00::/64"}]]}),
        "ipam.ranges[0][1].subnet",
        "same IP family",
    );
}

#[test]
fn route_gateway_of_the_other_family() {
    // A `gw` of the other family than `dst` cannot be installed as asked. ADD refuses it;
    // the parser (DEL, GC) still accepts it, so a pod whose configuration has such a
    // route is always released.
    let dual = |routes: Value| {
        json!({"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "fd00:1::/64"}]],
               "routes": routes})
    };
    for (routes, field, needle) in [
        (
            json!([{"dst": "0.0.0.0/0"}, {"dst": "2001:db8::/64", "gw": "10.1.0.1"}]),
            "ipam.routes[1].gw",
            "route to 2001:db8::/64 via 10.1.0.1 mixes families: gw is IPv4 but dst is IPv6",
        ),
        (
            json!([{"dst": "192.0.2.0/24", "gw": "fd00:1::1"}]),
            "ipam.routes[0].gw",
            "route to 192.0.2.0/24 via fd00:1::1 mixes families: gw is IPv6 but dst is IPv4",
        ),
    ] {
        let ipam = dual(routes);
        config_error(embedded(ipam.clone()).check_routes(), &ipam, field, needle);
    }
    // Same family, or no gw (ADD fills in the gateway of the dst's family): accepted.
    let cfg = embedded(dual(
        json!([{"dst": "192.0.2.0/24", "gw": "10.1.0.1"}, {"dst": "2001:db8::/64"}]),
    ));
    if let Err(e) = cfg.check_routes() {
        panic!("{:?} was refused: {e}", cfg.routes);
    }
}

#[test]
fn structural_errors() {
    refused(Value::Null, "ipam", "missing");
    refused(json!("host-local"), "ipam", "not a JSON object");
    refused(json!({}), "ipam.ranges", "no address ranges");
    refused(json!({"ranges": []}), "ipam.ranges", "no address ranges");
    refused(json!({"ranges": [[]]}), "ipam.ranges[0]", "empty range set");
    refused(
        json!({"ranges": [{"subnet": "10.0.0.0/24"}]}),
        "ipam.ranges[0]",
        "",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.0.0.0/24"}]], "routes": [{"gw": "10.0.0.1"}]}),
        "ipam.routes[0].dst",
        "missing",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.0.0.0/24"}]], "dataDir": "/var/lib/cni/networks"}),
        "ipam.dataDir",
        "top-level `dataDir`",
    );
    refused(
        json!({"ranges": [[{"subnet": "10.0.0.0/24"}]], "resolvConf": "resolv.conf"}),
        "ipam.resolvConf",
        "absolute",
    );
}

fn requests_for(
    ipam: Value,
    args: &[(&str, &str)],
    extra: Value,
) -> Result<Vec<Option<IpAddr>>, Error> {
    let dir = crate::common::data_dir();
    let mut doc = crate::common::netconf_json(dir.path(), ipam);
    if let (Some(obj), Some(extra)) = (doc.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            obj.insert(k.clone(), v.clone());
        }
    }
    let conf = parse(&doc, Command::Add);
    let cfg = embedded(conf.ipam.clone());
    let env = env("ADD", "c1", "eth0", args);
    let requested = requested_ips(&conf, &env)?;
    cfg.assign_requests(&requested)
}

fn dual() -> Value {
    json!({"ranges": [[{"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.99"}],
                      [{"subnet": "fd00:1::/64"}]]})
}

#[test]
fn requested_addresses_from_every_source() {
    let got = requests_for(
        dual(),
        &[("CNI_ARGS", "IP=10.1.0.20,fd00:1::20")],
        json!({}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, vec![Some(ip("10.1.0.20")), Some(ip("fd00:1::20"))]);

    let got = requests_for(
        dual(),
        &[],
        json!({"args": {"cni": {"ips": ["fd00:1::21/64"]}}}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, vec![None, Some(ip("fd00:1::21"))]);

    let got = requests_for(
        dual(),
        &[],
        json!({"runtimeConfig": {"ips": ["10.1.0.22/24"]}}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, vec![Some(ip("10.1.0.22")), None]);

    // The same address from two sources counts once.
    let got = requests_for(
        dual(),
        &[("CNI_ARGS", "IP=10.1.0.23")],
        json!({"runtimeConfig": {"ips": ["10.1.0.23"]}}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, vec![Some(ip("10.1.0.23")), None]);
}

fn ipam_error(result: Result<Vec<Option<IpAddr>>, Error>, needle: &str) {
    match result {
        Err(e @ Error::Ipam(_)) => {
            assert_eq!(e.code(), 100);
            assert!(
                e.to_string().contains(needle),
                "{e} should mention {needle:?}"
            );
        }
        other => panic!("expected an IPAM error mentioning {needle:?}, got {other:?}"),
    }
}

#[test]
fn bad_requested_addresses() {
    ipam_error(
        requests_for(dual(), &[("CNI_ARGS", "IP=192.168.0.1")], json!({})),
        "192.168.0.1 (CNI_ARGS IP) is outside every configured range",
    );
    ipam_error(
        requests_for(dual(), &[("CNI_ARGS", "IP=10.1.0.200")], json!({})),
        "outside its range 10.1.0.10-10.1.0.99",
    );
    ipam_error(
        requests_for(
            dual(),
            &[],
            json!({"runtimeConfig": {"ips": ["fd00:1::1"]}}),
        ),
        "fd00:1::1 (runtimeConfig.ips) is the gateway",
    );
    ipam_error(
        requests_for(
            dual(),
            &[("CNI_ARGS", "IP=10.1.0.20")],
            json!({"args": {"cni": {"ips": ["10.1.0.21"]}}}),
        ),
        "both fall in range set 0",
    );
    match requests_for(dual(), &[], json!({"args": {"cni": {"ips": ["nope"]}}})) {
        Err(Error::InvalidConfig { field, .. }) => assert_eq!(field, "args.cni.ips[0]"),
        other => panic!("expected a config error on args.cni.ips[0], got {other:?}"),
    }
    match requests_for(dual(), &[], json!({"runtimeConfig": {"ips": ["x"]}})) {
        Err(Error::InvalidConfig { field, .. }) => assert_eq!(field, "runtimeConfig.ips[0]"),
        other => panic!("expected a config error on runtimeConfig.ips[0], got {other:?}"),
    }
    match requests_for(dual(), &[("CNI_ARGS", "IP=10.1.0.x")], json!({})) {
        Err(e @ Error::InvalidEnv { .. }) => assert_eq!(e.code(), 4),
        other => panic!("expected an environment error, got {other:?}"),
    }
}
