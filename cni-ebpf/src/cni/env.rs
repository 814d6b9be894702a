//! The `CNI_*` environment of one invocation, validated per verb (spec section 2).

use std::{collections::BTreeMap, ffi::OsString, net::IpAddr, path::PathBuf};

use crate::error::{Error, Result};

/// The operation requested through `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Attach a container.
    Add,
    /// Detach a container.
    Del,
    /// Verify an attachment.
    Check,
    /// Report supported versions.
    Version,
    /// Report readiness (1.1.0).
    Status,
    /// Release everything not in a list of valid attachments (1.1.0).
    Gc,
}

impl Command {
    /// Parses the value of `CNI_COMMAND`.
    pub fn parse(value: &str) -> Result<Self> {
        Ok(match value {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "VERSION" => Self::Version,
            "STATUS" => Self::Status,
            "GC" => Self::Gc,
            "" => return Err(Error::env("CNI_COMMAND", "is empty")),
            other => {
                return Err(Error::env(
                    "CNI_COMMAND",
                    format!(
                    "unknown command {other:?} (expected ADD, DEL, CHECK, VERSION, STATUS or GC)"
                ),
                ))
            }
        })
    }

    /// The name as the spec spells it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Version => "VERSION",
            Self::Status => "STATUS",
            Self::Gc => "GC",
        }
    }
}

/// Keys of `CNI_ARGS` that we understand (the rest needs `IgnoreUnknown=1`).
const KNOWN_ARGS: &[&str] = &[
    "IgnoreUnknown",
    "IP",
    "MAC",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
];

/// Parsed `CNI_ARGS`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// All pairs in order of appearance (later duplicates win in [`CniArgs::get`]).
    pub pairs: BTreeMap<String, String>,
}

impl CniArgs {
    /// Parses `K=V;K=V`. Unknown keys are refused unless `IgnoreUnknown` is `1`/`true`.
    pub fn parse(raw: &str) -> Result<Self> {
        let mut pairs = BTreeMap::new();
        for part in raw.split(';').filter(|p| !p.is_empty()) {
            let Some((k, v)) = part.split_once('=') else {
                return Err(Error::env(
                    "CNI_ARGS",
                    format!("pair {part:?} is not of the form KEY=VALUE"),
                ));
            };
            if k.is_empty() {
                return Err(Error::env(
                    "CNI_ARGS",
                    format!("pair {part:?} has an empty key"),
                ));
            }
            pairs.insert(k.to_owned(), v.to_owned());
        }
        let ignore_unknown = pairs
            .get("IgnoreUnknown")
            .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        if !ignore_unknown {
            if let Some(k) = pairs.keys().find(|k| !KNOWN_ARGS.contains(&k.as_str())) {
                return Err(Error::env(
                    "CNI_ARGS",
                    format!("unknown key {k:?} (set IgnoreUnknown=1 to ignore unknown keys)"),
                ));
            }
        }
        Ok(Self { pairs })
    }

    /// The value of `key`, if present.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.get(key).map(String::as_str)
    }

    /// Static addresses requested with `IP=a[,b]`.
    pub fn ips(&self) -> Result<Vec<IpAddr>> {
        let Some(raw) = self.get("IP") else {
            return Ok(Vec::new());
        };
        raw.split(',')
            .map(|s| {
                let s = s.trim();
                // Accept `10.0.0.5/24` as well as `10.0.0.5`, like host-local.
                let addr = s.split_once('/').map_or(s, |(a, _)| a);
                addr.parse::<IpAddr>()
                    .map_err(|_| Error::env("CNI_ARGS", format!("IP={s:?} is not an IP address")))
            })
            .collect()
    }
}

/// The validated environment of one invocation.
#[derive(Debug, Clone)]
pub struct Env {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID` (required for ADD, DEL, CHECK).
    pub container_id: String,
    /// `CNI_NETNS` (required for ADD and CHECK; may be empty for DEL).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME` (required for ADD, DEL, CHECK).
    pub ifname: String,
    /// `CNI_ARGS`.
    pub args: CniArgs,
    /// `CNI_PATH`, split on `:`.
    pub path: Vec<PathBuf>,
}

/// Checks a container ID or network name against the spec's rule
/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`; returns the reason when it fails.
pub fn check_identifier(value: &str) -> Option<String> {
    let mut chars = value.chars();
    match chars.next() {
        None => return Some("must not be empty".into()),
        Some(c) if !c.is_ascii_alphanumeric() => {
            return Some(format!("{value:?} must start with a letter or digit"));
        }
        Some(_) => {}
    }
    chars
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        .map(|c| {
            format!("{value:?} contains {c:?}; only letters, digits, '_', '.' and '-' are allowed")
        })
}

/// Checks an interface name the way the kernel does (1–15 bytes, not `.`/`..`, no `/`,
/// `:` or whitespace); returns the reason when it fails.
pub fn check_ifname(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty".into());
    }
    if value.len() > 15 {
        return Some(format!(
            "{value:?} is {} bytes long; at most 15 are allowed",
            value.len()
        ));
    }
    if value == "." || value == ".." {
        return Some(format!("{value:?} is not a valid interface name"));
    }
    value
        .chars()
        .find(|c| *c == '/' || *c == ':' || c.is_whitespace() || c.is_control())
        .map(|c| format!("{value:?} contains {c:?}, which interface names cannot contain"))
}

impl Env {
    /// Reads and validates the environment for the verb in `CNI_COMMAND`.
    pub fn from_process() -> Result<Self> {
        Self::from_lookup(|k| std::env::var_os(k))
    }

    /// Like [`Env::from_process`], with the variables read through `get` (for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Result<Self> {
        let var = |name: &'static str| -> Result<Option<String>> {
            match get(name) {
                None => Ok(None),
                Some(v) => v
                    .into_string()
                    .map(Some)
                    .map_err(|_| Error::env(name, "is not valid UTF-8")),
            }
        };
        let command = match var("CNI_COMMAND")? {
            Some(c) => Command::parse(&c)?,
            None => return Err(Error::env("CNI_COMMAND", "is not set")),
        };
        let needs_attachment = matches!(command, Command::Add | Command::Del | Command::Check);

        let container_id = var("CNI_CONTAINERID")?.unwrap_or_default();
        if needs_attachment {
            if let Some(reason) = check_identifier(&container_id) {
                return Err(Error::env("CNI_CONTAINERID", reason));
            }
        }

        let ifname = var("CNI_IFNAME")?.unwrap_or_default();
        if needs_attachment {
            if let Some(reason) = check_ifname(&ifname) {
                return Err(Error::env("CNI_IFNAME", reason));
            }
        }

        let netns = var("CNI_NETNS")?
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        if matches!(command, Command::Add | Command::Check) {
            match &netns {
                None => return Err(Error::env("CNI_NETNS", "is required for ADD and CHECK")),
                Some(p) if !p.is_absolute() => {
                    return Err(Error::env(
                        "CNI_NETNS",
                        format!("{} is not an absolute path", p.display()),
                    ));
                }
                Some(_) => {}
            }
        }

        let args = CniArgs::parse(&var("CNI_ARGS")?.unwrap_or_default())?;

        let raw_path = var("CNI_PATH")?;
        if command == Command::Gc && raw_path.as_deref().is_none_or(str::is_empty) {
            return Err(Error::env("CNI_PATH", "is required for GC"));
        }
        let path = raw_path
            .unwrap_or_default()
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();

        Ok(Self {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }
}

#[cfg(test)]
#[expect(clippy::panic, reason = "tests panic with a message")]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(check_identifier("abc-1_2.3").is_none());
        assert!(check_identifier("0").is_none());
        for bad in ["", "-x", "../x", "a b", "a/b", ".x", "_x", "ä"] {
            assert!(check_identifier(bad).is_some(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ifnames() {
        assert!(check_ifname("eth0").is_none());
        assert!(check_ifname("a23456789012345").is_none());
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "eth 0",
            "a:b",
            "a234567890123456",
            "a\tb",
        ] {
            assert!(check_ifname(bad).is_some(), "{bad:?} accepted");
        }
    }

    #[test]
    fn cni_args() {
        let a = CniArgs::parse("IgnoreUnknown=1;FOO=bar;IP=10.0.0.5,fd00::5")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.get("FOO"), Some("bar"));
        assert_eq!(a.ips().map(|v| v.len()).ok(), Some(2));
        assert!(CniArgs::parse("FOO=bar").is_err());
        assert!(CniArgs::parse("K8S_POD_NAME=x;K8S_POD_NAMESPACE=y").is_ok());
        assert!(CniArgs::parse("novalue").is_err());
        assert!(CniArgs::parse("IP=nope").is_ok_and(|a| a.ips().is_err()));
        assert!(CniArgs::parse("").is_ok_and(|a| a.pairs.is_empty()));
    }
}
