//! The log file rotates by size (`logOptions`), also when many plugin
//! processes start at once, and is left alone for logrotate with `maxSize` 0.

use std::{fs, path::Path, thread};

use serde_json::json;
use testbed::SimNode;

/// `<log>.<n>`.
fn copy(log: &Path, n: u32) -> std::path::PathBuf {
    let mut s = log.as_os_str().to_owned();
    s.push(format!(".{n}"));
    s.into()
}

const MIB: usize = 1024 * 1024;

#[test]
#[ignore = "privileged: run via cargo xtask test"]
fn the_log_rotates_once_when_concurrent_adds_find_it_full() {
    let node = SimNode::new("log_rotation");
    let log = node.log_file();
    let conf = node
        .conf()
        .set("logOptions", json!({ "maxSize": 1, "maxBackups": 2 }));
    // An older copy and a full log: one rotation moves full → .1 and .1 → .2.
    fs::write(copy(&log, 1), "older copy\n").unwrap_or_else(|e| panic!("{e}"));
    let mut full = b"FULL ".repeat(MIB / 5 + 1);
    full.push(b'\n');
    fs::write(&log, &full).unwrap_or_else(|e| panic!("{e}"));

    // Six ADDs at once: each finds the log over 1 MiB; exactly one may rotate it.
    let pods: Vec<_> = (0..6).map(|i| node.pod(&format!("p{i}"))).collect();
    thread::scope(|s| {
        for p in &pods {
            let (node, conf) = (&node, &conf);
            s.spawn(move || node.add(p, "eth0", conf));
        }
    });
    let first = |p: &Path| {
        fs::read(p)
            .ok()
            .and_then(|b| b.split(|c| *c == b'\n').next().map(<[u8]>::to_vec))
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default()
    };
    assert!(
        first(&copy(&log, 1)).starts_with("FULL "),
        ".1 is the full log (a second rotation would have moved it to .2)"
    );
    assert_eq!(first(&copy(&log, 2)), "older copy", ".2 is the older copy");
    assert!(!copy(&log, 3).exists(), "maxBackups 2 keeps two copies");
    let new = fs::read_to_string(&log).unwrap_or_else(|e| panic!("{e}"));
    for p in &pods {
        assert!(
            new.contains(p.container_id()),
            "ADD of {} logged to the new file:\n{new}",
            p.container_id()
        );
    }
    assert!(new.len() < MIB, "the new log starts empty");
    for p in &pods {
        node.del(p, "eth0", &conf);
    }

    // maxSize 0: the plugin never rotates (logrotate owns the file).
    let off = node.conf().set("logOptions", json!({ "maxSize": 0 }));
    fs::write(&log, &full).unwrap_or_else(|e| panic!("{e}"));
    let _ = fs::remove_file(copy(&log, 1));
    let p = node.pod("q");
    node.add(&p, "eth0", &off);
    assert!(!copy(&log, 1).exists(), "maxSize 0 rotated the log");
    let text = fs::read_to_string(&log).unwrap_or_else(|e| panic!("{e}"));
    assert!(text.starts_with("FULL ") && text.contains(p.container_id()));
    node.del(&p, "eth0", &off);

    // Bad options are error 7 naming the field, and nothing is made.
    for (opts, field) in [
        (json!({ "maxBackups": 0 }), "logOptions.maxBackups"),
        (json!({ "maxSize": -1 }), "logOptions"),
    ] {
        let bad = node.conf().set("logOptions", opts);
        let r = node.pod("r");
        let e = node
            .exec_plugin("ADD", &r.env("eth0"), &bad.plugin())
            .assert_error(7);
        assert!(
            format!("{} {}", e.msg, e.details).contains(field),
            "names {field}: {e:?}"
        );
    }
    node.store("testnet")
        .assert_empty("after DEL and refused ADDs");
}
