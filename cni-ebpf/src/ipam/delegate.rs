//! Delegation to an IPAM plugin binary (spec section 4, "Delegated plugins").
//!
//! The plugin named by `ipam.type` is looked up in `CNI_PATH` and run with the same
//! environment (with `CNI_COMMAND` set to the verb being delegated and the other `CNI_*`
//! variables taken from the validated [`Env`]) and the same stdin bytes. Its stderr is
//! passed through; its stdout is parsed as the result (or the spec's error object).

use std::{
    io::Write,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command as Process, Stdio},
};

use serde_json::Value;

use crate::{
    cni::{
        config::NetConf,
        env::{Command, Env},
        result::CniResult,
    },
    error::{Error, Result},
};

/// Code reported when a delegate fails without printing the spec's error object.
pub const UNKNOWN_FAILURE: u32 = 999;

/// Finds the executable `plugin` in the directories of `CNI_PATH`, in order.
pub fn find(plugin: &str, path: &[PathBuf]) -> Result<PathBuf> {
    for dir in path {
        let candidate = dir.join(plugin);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(Error::config(
        "ipam.type",
        format!(
            "IPAM plugin {plugin:?} was not found in CNI_PATH ({})",
            if path.is_empty() {
                "empty".to_owned()
            } else {
                path.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            }
        ),
    ))
}

/// Runs `plugin` for `command` and returns its stdout on success. A failure becomes
/// [`Error::Delegate`] with the plugin's own code and message.
pub fn exec(plugin: &str, command: Command, env: &Env, stdin: &[u8]) -> Result<Vec<u8>> {
    let binary = find(plugin, &env.path)?;
    run_binary(plugin, &binary, command, env, stdin)
}

fn run_binary(
    plugin: &str,
    binary: &Path,
    command: Command,
    env: &Env,
    stdin: &[u8],
) -> Result<Vec<u8>> {
    let mut process = Process::new(binary);
    process
        .env("CNI_COMMAND", command.as_str())
        .env("CNI_CONTAINERID", &env.container_id)
        .env("CNI_IFNAME", &env.ifname)
        .env(
            "CNI_PATH",
            env.path
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    match &env.netns {
        Some(ns) => process.env("CNI_NETNS", ns),
        None => process.env_remove("CNI_NETNS"),
    };
    if env.args.pairs.is_empty() {
        process.env_remove("CNI_ARGS");
    } else {
        let args = env
            .args
            .pairs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";");
        process.env("CNI_ARGS", args);
    }
    let mut child = process
        .spawn()
        .map_err(|e| Error::io(format!("running IPAM plugin {}", binary.display()), e))?;
    let input = child.stdin.take();
    let output = std::thread::scope(|scope| {
        // Feed stdin from another thread so a plugin that writes before it has read
        // everything cannot deadlock us.
        scope.spawn(move || {
            if let Some(mut input) = input {
                // A plugin that exits without reading all of stdin is not our error.
                let _ = input.write_all(stdin);
            }
        });
        child.wait_with_output()
    })
    .map_err(|e| Error::io(format!("waiting for IPAM plugin {}", binary.display()), e))?;
    if output.status.success() {
        return Ok(output.stdout);
    }
    let parsed: Option<Value> = serde_json::from_slice(&output.stdout).ok();
    let code = parsed
        .as_ref()
        .and_then(|v| v.get("code"))
        .and_then(Value::as_u64)
        .and_then(|c| u32::try_from(c).ok());
    let msg = parsed
        .as_ref()
        .and_then(|v| v.get("msg"))
        .and_then(Value::as_str);
    let details = parsed
        .as_ref()
        .and_then(|v| v.get("details"))
        .and_then(Value::as_str)
        .filter(|d| !d.is_empty());
    Err(match (code, msg) {
        (Some(code), Some(msg)) => Error::Delegate {
            plugin: plugin.to_owned(),
            code,
            msg: match details {
                Some(d) => format!("{msg}: {d}"),
                None => msg.to_owned(),
            },
        },
        _ => {
            let out = String::from_utf8_lossy(&output.stdout);
            let out = out.trim();
            Error::Delegate {
                plugin: plugin.to_owned(),
                code: UNKNOWN_FAILURE,
                msg: format!(
                    "{} ({}) without a CNI error object{}",
                    command.as_str(),
                    output.status,
                    if out.is_empty() {
                        String::new()
                    } else {
                        format!("; stdout: {}", truncate(out, 512))
                    }
                ),
            }
        }
    })
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// ADD through the delegate; its result (of any version) is parsed into our model.
pub fn add(plugin: &str, conf: &NetConf, env: &Env, stdin: &[u8]) -> Result<CniResult> {
    let out = exec(plugin, Command::Add, env, stdin)?;
    let value: Value = serde_json::from_slice(&out).map_err(|e| Error::Decode {
        what: format!("the result of IPAM plugin {plugin}"),
        reason: e.to_string(),
    })?;
    CniResult::from_json(&value, conf.version).map_err(|e| Error::Decode {
        what: format!("the result of IPAM plugin {plugin}"),
        reason: e.to_string(),
    })
}

/// Whether the delegate speaks `version` (asked through its VERSION command).
pub fn supports(plugin: &str, conf: &NetConf, env: &Env, version: &str) -> Result<bool> {
    let stdin = serde_json::json!({ "cniVersion": conf.version.as_str() }).to_string();
    let out = exec(plugin, Command::Version, env, stdin.as_bytes())?;
    let value: Value = serde_json::from_slice(&out).map_err(|e| Error::Decode {
        what: format!("the VERSION output of IPAM plugin {plugin}"),
        reason: e.to_string(),
    })?;
    Ok(value
        .get("supportedVersions")
        .and_then(Value::as_array)
        .is_some_and(|v| v.iter().any(|s| s.as_str() == Some(version))))
}
