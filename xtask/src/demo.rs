//! `cargo xtask demo`: a simulated node with two pods networked by cni-ebpf.
//!
//! Builds `node` + `ext` namespaces and two pod namespaces, runs the real plugin binary
//! (ADD) for each pod inside the node namespace exactly as a runtime would, shows the
//! addresses and a ping between the pods and out to `ext`, then DELs and removes
//! everything — also when a step fails.

use std::{io::Write, path::Path, process::Stdio};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use testbed::{NetNs, NodeNamespaces, EXT_IP4, NODE_IP4};

/// Pin and data directories of the demo, removed on drop.
struct Dirs {
    pins: String,
    data: String,
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.pins);
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

fn plugin(
    node: &NetNs,
    bin: &Path,
    command: &str,
    cid: &str,
    netns: &Path,
    conf: &Value,
) -> Result<Value> {
    let mut child = node
        .command(&[bin])
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/usr/lib/cni")
        // What kubelet's runtime passes: `inspect` shows each endpoint's pod by it.
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME={cid}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running the plugin")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(conf.to_string().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("{command} {cid} failed: {text}");
    }
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    Ok(serde_json::from_str(text.trim())?)
}

fn show(title: &str, ns: &NetNs, argv: &[&str]) -> Result<()> {
    println!("\n--- {title}: {}", argv.join(" "));
    let out = ns.command(argv).output()?;
    print!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("{} failed", argv.join(" "));
    }
    Ok(())
}

/// Runs the demo.
pub fn run(bin: &Path) -> Result<()> {
    let sim = NodeNamespaces::create("cni-demo")?;
    let pods = [
        NetNs::create_replacing("cni-demo-pod-a")?,
        NetNs::create_replacing("cni-demo-pod-b")?,
    ];
    let pid = std::process::id();
    let dirs = Dirs {
        pins: format!("/sys/fs/bpf/cni-ebpf-demo-{pid}"),
        data: format!("/tmp/cni-ebpf-demo-{pid}"),
    };
    let conf = json!({
        "cniVersion": "1.1.0",
        "name": "demo",
        "type": "cni-ebpf",
        "mtu": 1500,
        "uplink": "uplink0",
        "ipMasq": true,
        "clusterCIDRs": ["10.244.0.0/16"],
        "bpffsRoot": dirs.pins,
        "dataDir": dirs.data,
        // The socket hooks (host ports for the node's own processes) would attach to the
        // machine's cgroup2 root; the demo leaves the machine alone.
        "cgroupPath": "",
        // No agent runs in the demo to put a NetworkPolicy in force: nothing waits for one.
        "networkPolicy": false,
        "ipam": {
            "ranges": [[{ "subnet": "10.244.1.0/24" }], [{ "subnet": "fd00:10:244:1::/64" }]],
            "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
        }
    });
    println!(
        "Simulated node: namespace {} (uplink0 {NODE_IP4}/24), outside world: {} ({EXT_IP4})",
        sim.node.name(),
        sim.ext.name()
    );

    let mut added = Vec::new();
    let result = (|| -> Result<()> {
        let mut addrs = Vec::new();
        for (i, pod) in pods.iter().enumerate() {
            let cid = format!("demo-pod-{i}");
            let res = plugin(&sim.node, bin, "ADD", &cid, pod.path(), &conf)?;
            added.push((cid.clone(), pod.path().to_path_buf()));
            println!(
                "\nADD {cid} ({}) → result:\n{}",
                pod.name(),
                serde_json::to_string_pretty(&res)?
            );
            let v4 = res["ips"]
                .as_array()
                .and_then(|ips| {
                    ips.iter()
                        .find_map(|ip| ip["address"].as_str().filter(|a| a.contains('.')))
                })
                .and_then(|a| a.split('/').next())
                .map(str::to_owned)
                .context("no IPv4 address in the result")?;
            addrs.push(v4);
        }
        show("pod a addresses", &pods[0], &["ip", "-br", "addr"])?;
        show("pod a routes", &pods[0], &["ip", "route"])?;
        show("node routes", &sim.node, &["ip", "route"])?;
        show(
            "pod a → pod b",
            &pods[0],
            &["ping", "-c", "3", "-i", "0.2", "-W", "1", &addrs[1]],
        )?;
        show(
            "pod b → pod a",
            &pods[1],
            &["ping", "-c", "3", "-i", "0.2", "-W", "1", &addrs[0]],
        )?;
        show(
            "pod a → node",
            &pods[0],
            &["ping", "-c", "2", "-i", "0.2", "-W", "1", NODE_IP4],
        )?;
        show(
            "pod a → ext (masqueraded)",
            &pods[0],
            &["ping", "-c", "2", "-i", "0.2", "-W", "1", EXT_IP4],
        )?;
        let inspect = sim
            .node
            .command(&[
                bin.to_string_lossy().as_ref(),
                "inspect",
                "--network",
                "demo",
                "--bpffs-root",
                &dirs.pins,
                "--data-dir",
                &dirs.data,
            ])
            .output()?;
        println!(
            "\n--- cni-ebpf inspect\n{}",
            String::from_utf8_lossy(&inspect.stdout)
        );
        Ok(())
    })();

    for (cid, netns) in added.iter().rev() {
        match plugin(&sim.node, bin, "DEL", cid, netns, &conf) {
            Ok(_) => println!("DEL {cid}: ok"),
            Err(e) => eprintln!("DEL {cid}: {e:#}"),
        }
    }
    drop(pods);
    drop(sim);
    drop(dirs);
    println!("cleaned up: namespaces, pins and the IPAM store are gone");
    result
}
