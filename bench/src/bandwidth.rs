//! Egress rates: a pod limited to a rate sends to ext with iperf3 — TCP, and
//! UDP offered at 3× the rate — on cni-ebpf (`runtimeConfig.bandwidth`, enforced by its
//! programs) and on the reference chain with the reference `bandwidth` plugin appended
//! (tbf behind an ifb device). Reported: the rate the receiver saw as a share of the
//! limit (accuracy: 1.00 is exact), and the machine's CPU time per megabit moved (from
//! `/proc/stat`, all CPUs, so only the ratio of the two columns means anything).

use std::{path::Path, time::Duration};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use super::{
    proc::{self, check_interrupt, Background},
    report::Report,
    topo::{BenchNode, Variant, Workspace, EXT_IP},
};

/// Sizes of the phase.
#[derive(Debug, Clone)]
pub struct Params {
    /// Seconds per iperf3 run.
    pub seconds: f64,
}

/// The limits measured, bits/s; the burst is 10 ms at the rate (the reference requires
/// one; small, so accuracy is the rate's).
const RATES: [u64; 2] = [20_000_000, 200_000_000];
const PORT: u16 = 5301;

/// Busy and total jiffies of all CPUs (`/proc/stat` first line).
fn cpu_jiffies() -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Ok((total - idle, total))
}

/// One iperf3 run from `client` to ext: (receiver Mbit/s, CPU seconds used by the machine).
fn run_iperf(client: &Path, udp_offer: Option<u64>, secs: f64) -> Result<(f64, f64)> {
    let secs_arg = format!("{}", secs.max(1.0).round());
    let port = PORT.to_string();
    let offer = udp_offer.map(|o| o.to_string());
    let mut argv = vec![
        "iperf3",
        "-c",
        EXT_IP,
        "-p",
        &port,
        "-t",
        &secs_arg,
        "-J",
        "--connect-timeout",
        "2000",
    ];
    if let Some(o) = &offer {
        argv.extend_from_slice(&["-u", "-b", o, "-l", "1200"]);
    }
    let (busy0, _) = cpu_jiffies()?;
    let out = proc::exec(&proc::Spec {
        argv: argv.iter().map(std::ffi::OsStr::new).collect(),
        env: Vec::new(),
        netns: Some(client),
        stdin: b"",
        timeout: Duration::from_secs_f64(secs + 20.0),
    })?;
    let (busy1, _) = cpu_jiffies()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cpu_s = (busy1.saturating_sub(busy0)) as f64 / hz;
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
    let bps = if udp_offer.is_some() {
        let sum = &v["end"]["sum"];
        sum["bits_per_second"]
            .as_f64()
            .map(|b| b * (1.0 - sum["lost_percent"].as_f64().unwrap_or(100.0) / 100.0))
    } else {
        v["end"]["sum_received"]["bits_per_second"].as_f64()
    };
    match bps {
        Some(b) if out.ok() => Ok((b / 1e6, cpu_s)),
        _ => bail!(
            "iperf3 failed: {} {}",
            v["error"].as_str().unwrap_or_default(),
            out.stderr.trim()
        ),
    }
}

/// Runs the phase into `report`.
pub fn run(ws: &Workspace, p: &Params, report: &mut Report) -> Result<()> {
    let mut details = Map::new();
    for variant in [Variant::Ebpf, Variant::Reference] {
        check_interrupt()?;
        eprintln!("bench: egress rates, {}", variant.key());
        let node = BenchNode::create(ws, variant, "bw")?;
        let _srv = Background::spawn(
            &node.ext_netns(),
            &["iperf3", "-s", "-p", &PORT.to_string()],
        )?;
        std::thread::sleep(Duration::from_millis(300));
        let mut vd = Map::new();
        for (i, &rate) in RATES.iter().enumerate() {
            let pod = node.pod(i)?;
            let chain = node.bandwidth_chain(rate, rate / 100);
            let add = chain.exec("ADD", &pod.id, &pod.path(), &[], None, |what, out| {
                if out.ok() {
                    Ok(())
                } else {
                    bail!("{what}: {} {}", out.stdout.trim(), out.stderr.trim())
                }
            })?;
            let mbit = rate as f64 / 1e6;
            for (proto, offer) in [("tcp", None), ("udp", Some(3 * rate))] {
                check_interrupt()?;
                // The one server may still be closing the previous test ("busy"): retry.
                let mut tries = 0;
                let (got, cpu_s) = loop {
                    match run_iperf(&pod.path(), offer, p.seconds) {
                        Err(e) if tries < 5 && format!("{e:#}").contains("busy") => {
                            tries += 1;
                            std::thread::sleep(Duration::from_secs(1));
                        }
                        r => break r?,
                    }
                };
                let section = format!("Egress rate {mbit:.0} Mbit/s (pod → ext, iperf3)");
                let what = if proto == "tcp" {
                    "TCP"
                } else {
                    "UDP offered at 3×"
                };
                report.put(
                    &format!("bw.{mbit:.0}.{proto}.accuracy"),
                    &section,
                    &format!("{what}: received ÷ limit (1.00 is exact)"),
                    "×",
                    true,
                    variant.key(),
                    got / mbit,
                );
                report.put(
                    &format!("bw.{mbit:.0}.{proto}.cpu"),
                    &section,
                    &format!("{what}: machine CPU per Mbit received"),
                    "ms",
                    false,
                    variant.key(),
                    if got > 0.0 {
                        cpu_s * 1e3 / (got * p.seconds.max(1.0).round())
                    } else {
                        0.0
                    },
                );
                vd.insert(
                    format!("{mbit:.0}-{proto}"),
                    json!({ "receivedMbit": got, "cpuSeconds": cpu_s }),
                );
            }
            chain.exec(
                "DEL",
                &pod.id,
                &pod.path(),
                &[],
                Some(&add.result),
                |_, _| Ok(()),
            )?;
        }
        details.insert(variant.key().into(), Value::Object(vd));
    }
    report
        .details
        .insert("bandwidth".into(), Value::Object(details));
    Ok(())
}
