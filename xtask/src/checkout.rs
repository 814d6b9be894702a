//! The build checkout: `cargo xtask test` builds and runs from a copy of the source tree at
//! one fixed path, `~/.cache/cni-ebpf/checkout`, whatever path the tree itself has.
//!
//! rustc's incremental caches hold only for sources at the path they were built from: a
//! clean clone at a new path rebuilt the test executables from nothing (over ten minutes on
//! two cores) where the same clone at the previous path took a minute and a half. The copy
//! is made file by file, and a file whose content is unchanged is not written, so it keeps
//! its old modification time: cargo then finds a crate nothing changed in fresh and does
//! not even start rustc for it.
//!
//! What is copied is what git lists (tracked files and untracked ones that are not
//! ignored), so uncommitted work is tested too. Files a previous copy made and the tree no
//! longer has are removed; what builds and runs leave in the copy (`target/`, fuzz corpora)
//! is never touched. A lock keeps two runs from sharing the copy at once.

use std::{
    collections::BTreeSet,
    fs::{self, File},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};

/// The file in the copy that lists what the last copy made (one relative path per line).
const MANIFEST: &str = ".xtask-checkout";

/// The copy, locked for as long as this value lives.
pub struct Checkout {
    pub root: PathBuf,
    _lock: Flock<File>,
}

/// Brings the copy at `dest` up to date with the tree at `src` and locks it.
pub fn sync(src: &Path, dest: &Path) -> Result<Checkout> {
    fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let lock_path = dest.with_extension("lock");
    let lock_file =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    eprintln!("xtask: locking the build checkout {}", dest.display());
    let lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .with_context(|| format!("locking {}", lock_path.display()))?;

    let files = listed(src)?;
    let before = previous(dest);
    let mut written = 0usize;
    for rel in &files {
        if copy_if_changed(&src.join(rel), &dest.join(rel))? {
            written += 1;
        }
    }
    let mut removed = 0usize;
    for gone in before.difference(&files) {
        let path = dest.join(gone);
        match fs::remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }
    let manifest: String = files.iter().map(|f| format!("{f}\n")).collect();
    fs::write(dest.join(MANIFEST), manifest).context("writing the checkout's manifest")?;
    eprintln!(
        "xtask: build checkout {}: {} files, {written} written, {removed} removed",
        dest.display(),
        files.len()
    );
    Ok(Checkout {
        root: dest.to_path_buf(),
        _lock: lock,
    })
}

/// The tree's files as git lists them: tracked, and untracked but not ignored; only those
/// that exist (a tracked file deleted in the work tree is left out).
fn listed(src: &Path) -> Result<BTreeSet<String>> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(src)
        .output()
        .context("running git ls-files (the build checkout copies what git lists)")?;
    if !out.status.success() {
        bail!(
            "git ls-files in {} failed: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut files = BTreeSet::new();
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let rel = std::str::from_utf8(name)
            .with_context(|| format!("a file name that is not UTF-8: {name:?}"))?;
        if rel == MANIFEST || rel.split('/').any(|c| c == ".." || c.is_empty()) {
            bail!("git lists a file the checkout cannot hold: {rel:?}");
        }
        let meta = match fs::symlink_metadata(src.join(rel)) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {rel}")),
        };
        if !meta.is_file() {
            bail!("{rel} is not a regular file; the build checkout copies only files");
        }
        files.insert(rel.to_owned());
    }
    Ok(files)
}

/// What the last copy made, from its manifest (nothing when there is none).
fn previous(dest: &Path) -> BTreeSet<String> {
    fs::read_to_string(dest.join(MANIFEST))
        .map(|s| s.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Copies `from` to `to` unless `to` already has the same bytes and permissions; says
/// whether it wrote.
fn copy_if_changed(from: &Path, to: &Path) -> Result<bool> {
    let want = fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    let mode = fs::metadata(from)
        .with_context(|| format!("reading {}", from.display()))?
        .permissions();
    if let (Ok(have), Ok(meta)) = (fs::read(to), fs::metadata(to)) {
        if have == want && meta.permissions() == mode {
            return Ok(false);
        }
    }
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // A new file renamed into place, so no build ever reads a half-written one.
    let tmp = to.with_file_name(format!(
        ".{}.xtask-new",
        to.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    fs::write(&tmp, &want).with_context(|| format!("writing {}", tmp.display()))?;
    fs::set_permissions(&tmp, mode).with_context(|| format!("setting {}", tmp.display()))?;
    fs::rename(&tmp, to).with_context(|| format!("replacing {}", to.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .args(args)
            .current_dir(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "git {args:?}");
    }

    fn mtime(p: &Path) -> std::time::SystemTime {
        fs::metadata(p).and_then(|m| m.modified()).unwrap()
    }

    #[test]
    fn copies_what_git_lists_and_keeps_unchanged_files_untouched() {
        let base = std::env::temp_dir().join(format!("xtask-checkout-{}", std::process::id()));
        let (src, dest) = (base.join("src"), base.join("dest"));
        fs::create_dir_all(src.join("a")).unwrap();
        git(&src, &["init", "-q"]);
        fs::write(src.join(".gitignore"), "/target\n").unwrap();
        fs::write(src.join("a/kept.rs"), "one").unwrap();
        fs::write(src.join("a/changed.rs"), "two").unwrap();
        fs::write(src.join("a/gone.rs"), "three").unwrap();
        fs::create_dir_all(src.join("target")).unwrap();
        fs::write(src.join("target/built"), "ignored").unwrap();
        git(&src, &["add", "."]);

        let first = sync(&src, &dest).unwrap();
        drop(first);
        assert_eq!(fs::read_to_string(dest.join("a/kept.rs")).unwrap(), "one");
        assert!(
            !dest.join("target/built").exists(),
            "ignored files are not copied"
        );
        // What a build leaves in the copy stays.
        fs::create_dir_all(dest.join("target")).unwrap();
        fs::write(dest.join("target/cache"), "kept").unwrap();

        let kept_at = mtime(&dest.join("a/kept.rs"));
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(src.join("a/changed.rs"), "two, changed").unwrap();
        fs::remove_file(src.join("a/gone.rs")).unwrap();
        fs::write(src.join("a/new.rs"), "untracked").unwrap();
        let second = sync(&src, &dest).unwrap();
        drop(second);

        assert_eq!(
            mtime(&dest.join("a/kept.rs")),
            kept_at,
            "an unchanged file is not written"
        );
        assert_eq!(
            fs::read_to_string(dest.join("a/changed.rs")).unwrap(),
            "two, changed"
        );
        assert_eq!(
            fs::read_to_string(dest.join("a/new.rs")).unwrap(),
            "untracked"
        );
        assert!(
            !dest.join("a/gone.rs").exists(),
            "a file the tree lost is removed"
        );
        assert_eq!(
            fs::read_to_string(dest.join("target/cache")).unwrap(),
            "kept"
        );
        fs::remove_dir_all(&base).unwrap();
    }
}
