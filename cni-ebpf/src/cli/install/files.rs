//! Files on the host: atomic writes (temp file, fsync, rename, directory fsync), stale
//! temporary files, the binary and the conflist in place.

use super::*;

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync'ed
/// and given `mode`, renamed over `path`; then the directory is fsync'ed. On failure the
/// temporary file is removed and `path` is as it was.
pub(super) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = parent(path);
    let mut tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .tempfile_in(dir)
        .map_err(io_err(format!(
            "creating a temporary file in {}",
            dir.display()
        )))?;
    let what = format!("writing {}", tmp.path().display());
    tmp.write_all(bytes).map_err(io_err(what.clone()))?;
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))
        .map_err(io_err(what.clone()))?;
    tmp.as_file().sync_all().map_err(io_err(what))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .map_err(io_err(format!("renaming into {}", path.display())))?;
    sync_dir(dir)
}

pub(super) fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(format!("syncing {}", dir.display())))
}

pub(super) fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))
}

/// Removes temporary files a killed `install` left in `dir` (older than [`STALE_TMP`], so
/// that a concurrent `install`'s file in the making is never touched).
pub(super) fn sweep_stale_tmp(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(std::result::Result::ok) {
        let stale = e.file_name().to_string_lossy().starts_with(TMP_PREFIX)
            && e.metadata().is_ok_and(|m| {
                m.is_file()
                    && m.modified()
                        .ok()
                        .and_then(|t| SystemTime::now().duration_since(t).ok())
                        .is_some_and(|age| age > STALE_TMP)
            });
        if stale {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Reads `path` if it is a regular file (`None`: nothing there). A symlink or anything
/// else is returned as foreign content (`Some(None)`).
pub(super) fn read_existing(path: &Path) -> Result<Option<Option<Vec<u8>>>> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(format!("inspecting {}", path.display()))(e)),
        Ok(m) if !m.is_file() => Ok(Some(None)),
        Ok(_) => fs::read(path)
            .map(|b| Some(Some(b)))
            .map_err(io_err(format!("reading {}", path.display()))),
    }
}

/// Copies this binary to `<bin dir>/cni-ebpf` unless it already has these bytes (then only
/// its mode is fixed if needed).
pub(super) fn install_binary(bin_dir: &Path) -> Result<(PathBuf, Outcome)> {
    let target = bin_dir.join(BINARY_NAME);
    let exe = Path::new("/proc/self/exe");
    let bytes = fs::read(exe).map_err(io_err("reading this binary (/proc/self/exe)"))?;
    create_dir(bin_dir)?;
    sweep_stale_tmp(bin_dir);
    let outcome = match read_existing(&target)? {
        None => Outcome::Written,
        Some(Some(old)) if old == bytes => {
            let meta = fs::metadata(&target)
                .map_err(io_err(format!("inspecting {}", target.display())))?;
            if meta.mode() & 0o7777 != 0o755 {
                fs::set_permissions(&target, Permissions::from_mode(0o755))
                    .map_err(io_err(format!("setting the mode of {}", target.display())))?;
            }
            return Ok((target, Outcome::Unchanged));
        }
        Some(_) => Outcome::Replaced,
    };
    write_atomic(&target, &bytes, 0o755)?;
    Ok((target, outcome))
}

/// Writes the conflist unless it already has these bytes; a foreign one at the path is
/// refused unless `force`.
pub(super) fn install_conflist(path: &Path, bytes: &[u8], force: bool) -> Result<Outcome> {
    let outcome = match read_existing(path)? {
        None => Outcome::Written,
        Some(Some(old)) if old == bytes => return Ok(Outcome::Unchanged),
        Some(Some(old)) if is_managed(&old) => Outcome::Replaced,
        Some(_) if force => Outcome::Replaced,
        Some(_) => {
            return Err(InstallError::Foreign {
                path: path.to_owned(),
                action: "replace",
            })
        }
    };
    write_atomic(path, bytes, 0o644)?;
    Ok(outcome)
}

/// The configuration files in `dir` a runtime would consider (`.conf`, `.conflist`,
/// `.json`, as libcni lists them), sorted as runtimes sort them.
pub(super) fn config_files(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(std::result::Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            !n.starts_with('.')
                && [".conf", ".conflist", ".json"]
                    .iter()
                    .any(|s| n.ends_with(s))
        })
        .collect();
    names.sort();
    names
}
