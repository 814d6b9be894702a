//! `cargo xtask fuzz`: the cargo-fuzz targets of `fuzz/` (the plugin's input parsers),
//! each run for a bounded time; `cargo xtask test` runs a short slice of the same.
//!
//! Targets are built with `--sanitizer none`: they fuzz safe Rust, where a sanitizer finds
//! nothing a panic would not, and the uninstrumented build is faster to build and to run.
//! The fuzz crate takes cni-ebpf without its `ebpf` feature: the parsers do not need the
//! eBPF object, and the fuzzing flags must not reach the eBPF build.

use std::{fs, path::Path, process::Command, time::Instant};

use anyhow::{bail, Context, Result};

use crate::workspace_root;

/// Every target in `fuzz/Cargo.toml`, in the order they run.
pub const TARGETS: &[&str] = &["netconf", "env", "result", "ipam_config", "store_record"];

/// Seconds per target in `cargo xtask test` (`CNI_EBPF_FUZZ_SECONDS` overrides; 0 skips).
pub const TEST_SECONDS: u64 = 12;

/// Codegen units of the fuzz builds. cargo-fuzz's default of one made compiling cni-ebpf
/// with coverage instrumentation take six and a half minutes on two cores, most of
/// `cargo xtask test`'s fuzz slice; sixteen build it in parallel, for somewhat slower
/// runs.
const CODEGEN_UNITS: &str = "16";

/// `cargo xtask fuzz` flags.
#[derive(clap::Args)]
pub struct Args {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Run only this target (default: all).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    pub target: Option<String>,
}

fn fuzz_cmd(root: &Path) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        .args(["+nightly", "fuzz"])
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        // Incremental, as the test build: a clean clone recompiles only what changed. Every
        // fuzz command sets it, since `fuzz run` rebuilds unless its flags match the build's.
        .env("CARGO_INCREMENTAL", "1");
    cmd
}

/// What one target's run did, from libFuzzer's final statistics.
struct Outcome {
    target: String,
    seconds: f64,
    execs: Option<u64>,
    corpus: usize,
    failure: Option<String>,
}

/// Runs `targets` for `seconds` each; fails when any of them finds a crash.
pub fn run(seconds: u64, targets: &[&str]) -> Result<()> {
    let root = workspace_root();
    let started = Instant::now();
    eprintln!("xtask: building the fuzz targets (cargo +nightly fuzz build)");
    crate::run(
        fuzz_cmd(&root)
            .args([
                "build",
                "--sanitizer",
                "none",
                "--codegen-units",
                CODEGEN_UNITS,
            ])
            .arg("--target-dir")
            .arg(crate::cache_dir("fuzz-target")),
    )?;
    let built = started.elapsed().as_secs_f64();
    let logs = root.join("fuzz/target/logs");
    fs::create_dir_all(&logs).context("creating fuzz/target/logs")?;
    let mut outcomes = Vec::new();
    for target in targets {
        outcomes.push(run_one(&root, &logs, target, seconds)?);
    }
    eprintln!("xtask: fuzzing report (build {built:.0} s)");
    eprintln!(
        "  {:<14} {:>7} {:>12} {:>7}  result",
        "target", "seconds", "executions", "corpus"
    );
    for o in &outcomes {
        eprintln!(
            "  {:<14} {:>7.0} {:>12} {:>7}  {}",
            o.target,
            o.seconds,
            o.execs.map_or_else(|| "?".to_owned(), |n| n.to_string()),
            o.corpus,
            o.failure.as_deref().unwrap_or("no failure"),
        );
    }
    eprintln!(
        "xtask: fuzzing took {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.failure.is_some())
        .map(|o| o.target.as_str())
        .collect();
    if !failed.is_empty() {
        bail!(
            "fuzz targets failed: {} (inputs in {}/<target>/; reproduce with \
             `cd fuzz && cargo +nightly fuzz run -s none <target> <input>`)",
            failed.join(", "),
            root.join("fuzz/artifacts").display()
        );
    }
    Ok(())
}

fn run_one(root: &Path, logs: &Path, target: &str, seconds: u64) -> Result<Outcome> {
    eprintln!("xtask: fuzzing {target} for {seconds} s");
    let log = logs.join(format!("{target}.log"));
    let file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let started = Instant::now();
    // The committed seeds live in the target's corpus directory with the inputs libFuzzer
    // adds (those are git-ignored).
    let status = fuzz_cmd(root)
        .args([
            "run",
            "--sanitizer",
            "none",
            "--codegen-units",
            CODEGEN_UNITS,
        ])
        .arg("--target-dir")
        .arg(crate::cache_dir("fuzz-target"))
        .args([target, "--"])
        .arg(format!("-max_total_time={seconds}"))
        .args(["-print_final_stats=1", "-rss_limit_mb=2048", "-timeout=10"])
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("running cargo fuzz run {target}"))?;
    let text = fs::read_to_string(&log).unwrap_or_default();
    let execs = text
        .lines()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|n| n.trim().parse().ok());
    let corpus = count_files(&root.join("fuzz/corpus").join(target));
    let failure = (!status.success()).then(|| {
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        eprintln!("--- {target}: last lines of {} ---", log.display());
        for l in tail.iter().rev() {
            eprintln!("{l}");
        }
        let artifact = text
            .lines()
            .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
            .unwrap_or("no input written");
        format!(
            "FAILED ({status}); input: {artifact}; log: {}",
            log.display()
        )
    });
    Ok(Outcome {
        target: target.to_owned(),
        seconds: started.elapsed().as_secs_f64(),
        execs,
        corpus,
        failure,
    })
}

fn count_files(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |d| d.filter_map(Result::ok).count())
}
