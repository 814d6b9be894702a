//! A serving certificate read from two PEM files (`--flows-tls-cert`, `--flows-tls-key`)
//! and read again when either changes, so that a rotation (cert-manager writing a new
//! Secret into the mounted files) takes effect at the next connection, without a restart.
//! A pair that does not load is refused at start; later, the last good pair is kept and
//! the failure logged. Files that are not there yet (an optional Secret the operator has
//! still to make) are waited for: until they load, no connection is served at all, never
//! one in clear.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::SystemTime,
};

use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result};

/// The files, and what was last loaded from them.
pub struct ServingCert {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<Loaded>,
}

struct Loaded {
    /// The files' modification times when last read.
    stamps: (Option<SystemTime>, Option<SystemTime>),
    /// `None`: no pair has loaded yet.
    acceptor: Option<TlsAcceptor>,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ServingCert {
    /// Loads `cert` and `key`; when neither file is there yet, waits for them (see
    /// [`Self::acceptor`]).
    ///
    /// # Errors
    /// Either is there but cannot be read, does not parse, or they do not go together
    /// (named as `--flows-tls-cert`).
    pub fn load(cert: &Path, key: &Path) -> Result<Self> {
        let loaded = if stamps(cert, key) == (None, None) {
            Loaded {
                stamps: (None, None),
                acceptor: None,
            }
        } else {
            read(cert, key).map_err(|e| Error::config("--flows-tls-cert", e))?
        };
        Ok(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            loaded: Mutex::new(loaded),
        })
    }

    /// Neither file was there when it was loaded: no connection is served until they are.
    pub fn waiting(&self) -> bool {
        self.loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .acceptor
            .is_none()
    }

    /// The acceptor for a new connection: from the files as they are now if they changed
    /// since they were read (and load), else as loaded. `None`: no pair has loaded yet,
    /// and the connection is not to be served.
    pub fn acceptor(&self) -> Option<TlsAcceptor> {
        let mut l = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = stamps(&self.cert, &self.key);
        if now != l.stamps {
            match read(&self.cert, &self.key) {
                Ok(fresh) => {
                    tracing::info!("flows: serving certificate {} read", self.cert.display());
                    *l = fresh;
                }
                Err(e) => {
                    if l.acceptor.is_some() {
                        tracing::warn!("flows: keeping the serving certificate in use: {e}");
                    } else {
                        tracing::warn!("flows: no serving certificate loads yet: {e}");
                    }
                    // Not read again until the files change once more.
                    l.stamps = now;
                }
            }
        }
        l.acceptor.clone()
    }
}

fn stamps(cert: &Path, key: &Path) -> (Option<SystemTime>, Option<SystemTime>) {
    let at = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (at(cert), at(key))
}

fn read(cert: &Path, key: &Path) -> std::result::Result<Loaded, String> {
    let stamps = stamps(cert, key);
    let file = |p: &Path| std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()));
    let config = crate::tls::server(&file(cert)?, &file(key)?)
        .map_err(|e| format!("{} and {}: {e}", cert.display(), key.display()))?;
    Ok(Loaded {
        stamps,
        acceptor: Some(TlsAcceptor::from(Arc::new(config))),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn a_pair_that_does_not_load_is_refused_naming_the_setting_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        // The certificate without its key.
        std::fs::write(&cert, "not a certificate").unwrap();
        let e = ServingCert::load(&cert, &key).unwrap_err().to_string();
        assert!(
            e.contains("--flows-tls-cert") && e.contains("tls.key"),
            "{e}"
        );
        std::fs::write(&key, "not a key").unwrap();
        let e = ServingCert::load(&cert, &key).unwrap_err().to_string();
        assert!(e.contains("holds no CERTIFICATE"), "{e}");
    }
}
