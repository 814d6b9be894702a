//! The container image of `deploy/Containerfile`, built offline with buildah from the
//! static binary, run as a container (runc, no network: `--network none`) with a temporary
//! "host root" bind-mounted at `/host`: its `install` writes the binary and the conflist
//! there, a second run changes nothing, and the image has nothing but the binary and its
//! licence. buildah keeps its storage and run state in a temporary directory of the
//! test's own, removed afterwards (and root's blob-info cache in /var/lib/containers, which
//! is removed too when the test created it); nothing touches the machine's network or its
//! container storage.
//!
//! The binary is `$CNI_EBPF_STATIC_BIN` (`cargo xtask test` builds it for the musl target),
//! else `target/x86_64-unknown-linux-musl/release/cni-ebpf`.
//!
//! The image index of both architectures, as `cargo xtask image --oci-archive` writes it,
//! is taken apart from its archive (`$CNI_EBPF_IMAGE_ARCHIVE`, which `cargo xtask test`
//! builds): a platform per image, each image's configuration saying the same, and a static
//! binary for that machine in each.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;
use testbed::plugin::workspace_root;

/// The static binary the image is built from.
fn static_bin() -> PathBuf {
    let (path, from_env) = match std::env::var_os("CNI_EBPF_STATIC_BIN") {
        Some(p) => (PathBuf::from(p), true),
        None => (
            workspace_root().join("target/x86_64-unknown-linux-musl/release/cni-ebpf"),
            false,
        ),
    };
    assert!(
        path.is_file(),
        "static binary {} not found{}: run through `cargo xtask test`, or build it with \
         `cargo build --release -p cni-ebpf --target x86_64-unknown-linux-musl`",
        path.display(),
        if from_env {
            " (CNI_EBPF_STATIC_BIN)"
        } else {
            ""
        }
    );
    path
}

/// Where containers/image keeps root's blob-info cache whatever `--root` says (buildah
/// has no option for it); `bud` creates it.
const SYSTEM_CACHE: &str = "/var/lib/containers";

/// buildah with its storage and run state in a directory of this test; every container
/// and image it made is removed on drop, then the directory, and the system blob-info
/// cache if this test created it.
struct Buildah {
    dir: tempfile::TempDir,
    made_system_cache: bool,
}

impl Buildah {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("buildah-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap_or_else(|e| panic!("creating buildah's directory: {e}"));
        Self {
            dir,
            made_system_cache: !Path::new(SYSTEM_CACHE).exists(),
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("buildah");
        c.arg("--root")
            .arg(self.dir.path().join("storage"))
            .arg("--runroot")
            .arg(self.dir.path().join("run"))
            // vfs: plain directories, no overlay mount to leave behind.
            .args(["--storage-driver", "vfs"]);
        c
    }

    /// Runs `buildah <args>`, asserting success; returns stdout.
    fn run(&self, args: &[&str]) -> String {
        let out = self
            .cmd()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running buildah (install it: cargo xtask setup): {e}"));
        assert!(
            out.status.success(),
            "buildah {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Buildah {
    fn drop(&mut self) {
        let _ = self.cmd().args(["rm", "--all"]).output();
        let _ = self.cmd().args(["rmi", "--all", "--force"]).output();
        if self.made_system_cache {
            let _ = std::fs::remove_dir_all(SYSTEM_CACHE);
        }
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
#[ignore = "privileged, needs buildah and runc: run via cargo xtask test"]
fn the_image_installs_into_a_host_root() {
    let bin = static_bin();
    let b = Buildah::new();

    // The build context: the binary and LICENSE only, as `cargo xtask image` stages it.
    let ctx = b.dir.path().join("context");
    std::fs::create_dir(&ctx).unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(&bin, ctx.join("cni-ebpf")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(workspace_root().join("LICENSE"), ctx.join("LICENSE"))
        .unwrap_or_else(|e| panic!("{e}"));
    let tag = format!("localhost/cni-ebpf-test:{}", std::process::id());
    let containerfile = workspace_root().join("deploy/Containerfile");
    b.run(&[
        "bud",
        "-f",
        containerfile.to_str().unwrap_or_default(),
        "-t",
        &tag,
        ctx.to_str().unwrap_or_default(),
    ]);

    // The image: the entrypoint is the binary; the root holds the binary and LICENSE only.
    let info: Value = serde_json::from_str(&b.run(&["inspect", "--type", "image", &tag]))
        .unwrap_or_else(|e| panic!("buildah inspect: {e}"));
    assert_eq!(
        info["OCIv1"]["config"]["Entrypoint"],
        serde_json::json!(["/cni-ebpf"]),
        "{}",
        info["OCIv1"]["config"]
    );
    assert_eq!(
        info["OCIv1"]["config"]["Labels"]["org.opencontainers.image.licenses"],
        "Apache-2.0"
    );
    let ctr = b.run(&["from", &tag]).trim().to_owned();
    let mnt = PathBuf::from(b.run(&["mount", &ctr]).trim());
    let mut names: Vec<String> = std::fs::read_dir(&mnt)
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    assert_eq!(names, ["LICENSE", "cni-ebpf"], "the image's root");
    assert_eq!(read(&mnt.join("cni-ebpf")), read(&bin));
    b.run(&["umount", &ctr]);

    // Run it: no network namespace setup on the machine (`--network none`), the host root
    // bind-mounted at /host as the DaemonSet mounts the host's directories.
    let host = b.dir.path().join("host");
    std::fs::create_dir(&host).unwrap_or_else(|e| panic!("{e}"));
    let volume = format!("{}:/host", host.display());
    let install = |b: &Buildah| {
        b.run(&[
            "run",
            "--network",
            "none",
            "--volume",
            &volume,
            &ctr,
            "--",
            "/cni-ebpf",
            "install",
            "--cni-bin-dir=/host/opt/cni/bin",
            "--cni-conf-dir=/host/etc/cni/net.d",
            "--pod-cidr=10.244.7.0/24",
            "--pod-cidr=fd00:10:244:7::/64",
            "--ip-masq",
        ])
    };
    let out = install(&b);
    assert!(out.contains("cni-ebpf: written"), "{out}");
    assert!(out.contains("10-cni-ebpf.conflist: written"), "{out}");
    let installed = host.join("opt/cni/bin/cni-ebpf");
    assert_eq!(
        read(&installed),
        read(&bin),
        "the installed binary is the image's"
    );
    let conflist: Value =
        serde_json::from_slice(&read(&host.join("etc/cni/net.d/10-cni-ebpf.conflist")))
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(conflist["cni-ebpf.dev/managed"], true);
    assert_eq!(
        conflist["plugins"][0]["ipam"]["ranges"],
        serde_json::json!([[{ "subnet": "10.244.7.0/24" }], [{ "subnet": "fd00:10:244:7::/64" }]])
    );
    // The installed binary runs on the host too (static: no loader, no libc needed).
    let version = Command::new(&installed)
        .arg("version")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", installed.display()));
    assert!(
        String::from_utf8_lossy(&version.stdout).contains("eBPF programs: embedded"),
        "{}",
        String::from_utf8_lossy(&version.stdout)
    );

    // Idempotent, as an init container restarting on every pod restart must be.
    let out = install(&b);
    assert_eq!(out.matches(": unchanged").count(), 2, "{out}");
}

/// A JSON file, parsed.
fn json_at(path: &Path) -> Value {
    serde_json::from_slice(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The path of the blob a descriptor names in the OCI layout `dir`.
fn blob(dir: &Path, descriptor: &Value) -> PathBuf {
    let digest = descriptor["digest"].as_str().unwrap_or_default();
    let Some(hex) = digest.strip_prefix("sha256:") else {
        panic!("descriptor without a sha256 digest: {descriptor}");
    };
    dir.join("blobs/sha256").join(hex)
}

/// `tar -xf archive -C dir` (tar finds a layer's compression itself).
fn untar(archive: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("running tar: {e}"));
    assert!(
        out.status.success(),
        "tar -xf {}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `e_machine` of a 64-bit little-endian ELF file, and whether it has a `PT_INTERP`
/// program header (a dynamically linked executable).
fn elf_machine_and_interp(elf: &[u8]) -> (u16, bool) {
    assert!(
        elf.len() > 0x40 && elf[..4] == *b"\x7fELF" && elf[4] == 2 && elf[5] == 1,
        "not a 64-bit little-endian ELF file"
    );
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]);
    let mut phoff = [0u8; 8];
    phoff.copy_from_slice(&elf[0x20..0x28]);
    let phoff = usize::try_from(u64::from_le_bytes(phoff)).unwrap_or(usize::MAX);
    let interp = (0..usize::from(u16_at(0x38))).any(|i| {
        let at = phoff + i * usize::from(u16_at(0x36));
        elf.get(at..at + 4) == Some(&3u32.to_le_bytes()[..])
    });
    (u16_at(0x12), interp)
}

/// The image index `cargo xtask image --oci-archive` writes (`$CNI_EBPF_IMAGE_ARCHIVE`:
/// `cargo xtask test` builds it with the same code from the x86_64 and aarch64 static
/// binaries) taken apart: one image per architecture, each platform in the index matching
/// its image's configuration, and each image's root holding LICENSE and a static binary
/// for that machine.
#[test]
#[ignore = "needs the image index that cargo xtask test builds"]
fn the_image_index_has_an_image_for_each_architecture() {
    let Some(archive) = std::env::var_os("CNI_EBPF_IMAGE_ARCHIVE").map(PathBuf::from) else {
        panic!(
            "CNI_EBPF_IMAGE_ARCHIVE is not set: run through `cargo xtask test`, or set it to \
             what `cargo xtask image --oci-archive PATH` wrote"
        );
    };
    let dir = tempfile::Builder::new()
        .prefix("image-index-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap_or_else(|e| panic!("{e}"));
    let layout = dir.path().join("layout");
    untar(&archive, &layout);

    // index.json names the pushed image index (or is it, in a layout of one index).
    let top = json_at(&layout.join("index.json"));
    let top_manifests = top["manifests"].as_array().cloned().unwrap_or_default();
    let index = match top_manifests.as_slice() {
        [one] if one["mediaType"] == "application/vnd.oci.image.index.v1+json" => {
            json_at(&blob(&layout, one))
        }
        _ => top,
    };
    assert_eq!(
        index["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{index}"
    );
    let manifests = index["manifests"].as_array().cloned().unwrap_or_default();

    // (OCI architecture, ELF machine) of each image, in the index's order.
    let mut found = Vec::new();
    for (i, descriptor) in manifests.iter().enumerate() {
        let platform = &descriptor["platform"];
        assert_eq!(platform["os"], "linux", "{descriptor}");
        let arch = platform["architecture"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let manifest = json_at(&blob(&layout, descriptor));
        let config = json_at(&blob(&layout, &manifest["config"]));
        assert_eq!(config["architecture"], arch.as_str(), "{arch}: the config");
        assert_eq!(config["os"], "linux", "{arch}: the config");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/cni-ebpf"]),
            "{arch}: {}",
            config["config"]
        );
        let root = dir.path().join(format!("root-{i}"));
        for layer in manifest["layers"].as_array().cloned().unwrap_or_default() {
            untar(&blob(&layout, &layer), &root);
        }
        let mut names: Vec<String> = std::fs::read_dir(&root)
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        assert_eq!(names, ["LICENSE", "cni-ebpf"], "{arch}: the image's root");
        let (machine, interp) = elf_machine_and_interp(&read(&root.join("cni-ebpf")));
        assert!(!interp, "{arch}: the binary is dynamically linked");
        found.push((arch, machine));
    }
    // EM_X86_64 and EM_AARCH64.
    assert_eq!(
        found,
        [("amd64".to_owned(), 62), ("arm64".to_owned(), 183)],
        "(architecture, ELF machine) of each image"
    );
}
