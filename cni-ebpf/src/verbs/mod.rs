//! The CNI verbs and the plugin-mode entry point.
//!
//! `main` is the only place that writes to stdout: exactly one JSON document, the result
//! or the error.

use std::{
    io::{Read, Write},
    process::ExitCode,
};

use serde_json::Value;

use crate::{
    cni::{
        config::NetConf,
        env::{Command, Env},
        version::LATEST,
    },
    error::{Error, Result},
};

pub mod add;
pub mod check;
pub mod del;
pub mod gc;
pub mod status;
pub mod unlabelled_veths;
pub mod version;

/// Runs one CNI operation from the process environment and stdin.
#[must_use]
pub fn main() -> ExitCode {
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    let outcome = match read {
        Err(e) => Err(Error::io("reading the network configuration from stdin", e)),
        Ok(_) => run(&stdin),
    };
    match outcome {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(doc)) => {
            print_json(&doc);
            ExitCode::SUCCESS
        }
        Err(e) => {
            let version = error_version(&stdin);
            tracing::error!(code = e.code(), "{e}");
            print_json(&e.to_json(&version));
            ExitCode::FAILURE
        }
    }
}

/// The `cniVersion` to put in an error: the configuration's if it can be read.
fn error_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .filter(|v| crate::cni::version::SUPPORTED.contains(&v.as_str()))
        .unwrap_or_else(|| LATEST.to_owned())
}

fn print_json(doc: &Value) {
    let mut out = std::io::stdout().lock();
    // Nothing sensible can be done if stdout is gone.
    let _ = serde_json::to_writer(&mut out, doc);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// Validates the environment and configuration, then runs the verb. Returns the JSON
/// document to print, if the verb has one.
pub fn run(stdin: &[u8]) -> Result<Option<Value>> {
    let env = Env::from_process()?;
    if env.command == Command::Version {
        return version::run(stdin).map(Some);
    }
    let conf = NetConf::parse(stdin, env.command)?;
    crate::logging::init(&conf.log_level, conf.log_file.as_deref(), conf.log_rotation);
    for key in &conf.unknown_keys {
        tracing::warn!(key = %key, "unknown configuration key {key:?} is ignored");
    }
    tracing::info!(
        command = env.command.as_str(),
        container = %env.container_id,
        ifname = %env.ifname,
        network = %conf.name,
        "start"
    );
    let out = dispatch(&env, &conf, stdin);
    match &out {
        Ok(_) => {
            tracing::info!(command = env.command.as_str(), container = %env.container_id, "done")
        }
        Err(e) => {
            tracing::warn!(command = env.command.as_str(), container = %env.container_id, code = e.code(), "failed: {e}")
        }
    }
    out
}

fn dispatch(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<Option<Value>> {
    match env.command {
        Command::Version => version::run(stdin).map(Some),
        Command::Add => add::run(env, conf, stdin).map(Some),
        Command::Del => del::run(env, conf, stdin).map(|()| None),
        Command::Check => check::run(env, conf, stdin).map(|()| None),
        Command::Status => status::run(env, conf, stdin).map(|()| None),
        Command::Gc => gc::run(env, conf, stdin).map(|()| None),
    }
}
