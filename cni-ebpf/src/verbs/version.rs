//! VERSION: the versions we support.

use serde_json::{json, Value};

use crate::{
    cni::version::{Version, LATEST, SUPPORTED},
    error::{Error, Result},
};

/// Answers VERSION. The input may name a `cniVersion` (echoed back when supported); an
/// empty stdin is answered in the newest version.
pub fn run(stdin: &[u8]) -> Result<Value> {
    let mut version = LATEST.to_owned();
    if !stdin.iter().all(u8::is_ascii_whitespace) {
        let v: Value = serde_json::from_slice(stdin).map_err(|e| Error::Decode {
            what: "VERSION input".into(),
            reason: e.to_string(),
        })?;
        if let Some(s) = v.get("cniVersion").and_then(Value::as_str) {
            version = Version::parse(s)?.as_str().to_owned();
        }
    }
    Ok(json!({ "cniVersion": version, "supportedVersions": SUPPORTED }))
}
