//! Packet fuzzing: random and mutated frames through each eBPF program with
//! `BPF_PROG_TEST_RUN`. Root and the eBPF object are needed: run through `cargo xtask test`.
//!
//! A fixed number of frames per program from a seeded generator (no dependency: a
//! xorshift), so a failure reproduces: `CNI_EBPF_PACKET_FUZZ_SEED` and
//! `CNI_EBPF_PACKET_FUZZ_ITERS` change the seed and the count. Properties:
//! - the run itself never fails and the verdict is one the programs return (pass, ok,
//!   shot, redirect);
//! - a frame we do not own — not IPv4/IPv6, or on the uplink an IPv4 flow between two
//!   addresses the node knows nothing about — passes unchanged;
//! - a well-formed frame that a program rewrites and does not drop leaves with a right IPv4
//!   header checksum and a right TCP/UDP/ICMP checksum (the support module's independent
//!   implementation).

use std::net::Ipv4Addr;

use testbed::packet::*;

/// TEST-NET-3: addresses nothing in the fixture's node knows.
fn foreign(r: &mut Rng) -> Ipv4Addr {
    Ipv4Addr::new(203, 0, 113, r.below(256) as u8)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A well-formed IPv4 TCP/UDP/ICMP frame between addresses the datapath cares about.
fn well_formed(r: &mut Rng) -> Vec<u8> {
    let addrs = [POD_A, POD_B, REMOTE_POD, EXT, NODE, NODE2, GATEWAY];
    let src = if r.below(8) == 0 {
        foreign(r)
    } else {
        r.pick(&addrs)
    };
    let dst = if r.below(8) == 0 {
        foreign(r)
    } else {
        r.pick(&addrs)
    };
    let macs = [
        HOST_MAC_A, POD_MAC_A, HOST_MAC_B, POD_MAC_B, UPLINK_MAC, EXT_MAC,
    ];
    let (dmac, smac) = (r.pick(&macs), r.pick(&macs));
    let port = |r: &mut Rng| match r.below(4) {
        0 => r.pick(&[80, 53, 8080, 30080, 443]),
        1 => SNAT_PORTS.0 + r.below(u64::from(SNAT_PORTS.1 - SNAT_PORTS.0) + 1) as u16,
        _ => r.next() as u16,
    };
    let data = {
        let n = r.below(64) as usize;
        r.bytes(n)
    };
    let (proto, l4) = match r.below(4) {
        0 | 1 => {
            let flags = r.pick(&[SYN, ACK, SYN | ACK, 0x11, 0x04, 0x18]);
            let (sp, dp) = (port(r), port(r));
            (TCP, tcp(src, dst, sp, dp, flags, &data))
        }
        2 => {
            let (sp, dp) = (port(r), port(r));
            let csum = r.below(4) != 0;
            (UDP, udp(src, dst, sp, dp, &data, csum))
        }
        _ => {
            let ty = r.pick(&[0, 8, 3, 11, 5, 13]);
            if ty == 0 || ty == 8 {
                (ICMP, echo(ty, r.next() as u16, r.next() as u16))
            } else {
                // An error quoting a (possibly masqueraded) flow's first bytes.
                let inner_src = r.pick(&[NODE, POD_A, EXT]);
                let inner_dst = r.pick(&[EXT, NODE, POD_B]);
                let (sp, dp) = (port(r), port(r));
                let quoted = ipv4(
                    inner_src,
                    inner_dst,
                    TCP,
                    64,
                    &tcp(inner_src, inner_dst, sp, dp, SYN, b"")[..8],
                );
                (ICMP, icmp(ty, 0, [0; 4], &quoted))
            }
        }
    };
    frame(dmac, smac, src, dst, proto, &l4)
}

/// A frame with some bytes flipped, truncated, or extended (anything may happen to it).
fn mutated(r: &mut Rng) -> Vec<u8> {
    let mut f = well_formed(r);
    for _ in 0..=r.below(4) {
        match r.below(4) {
            0 if f.len() > 15 => {
                let n = 14 + r.below(f.len() as u64 - 14) as usize;
                f.truncate(n);
            }
            1 => {
                let n = r.below(32) as usize;
                f.extend(r.bytes(n));
            }
            _ => {
                let i = r.below(f.len() as u64) as usize;
                f[i] = r.next() as u8;
            }
        }
    }
    f
}

/// Random bytes after an Ethernet header with a random, IPv4 or IPv6 ethertype.
fn random(r: &mut Rng) -> Vec<u8> {
    let ethertype: u16 = match r.below(3) {
        0 => 0x0800,
        1 => 0x86dd,
        _ => r.next() as u16,
    };
    let n = r.below(160) as usize;
    let mut payload = r.bytes(n);
    if ethertype == 0x0800 && !payload.is_empty() {
        payload[0] = 0x40 | (payload[0] & 0x0f);
    }
    if ethertype == 0x86dd && !payload.is_empty() {
        payload[0] = 0x60 | (payload[0] & 0x0f);
    }
    eth(
        r.pick(&[HOST_MAC_A, UPLINK_MAC]),
        EXT_MAC,
        ethertype,
        &payload,
    )
}

/// A frame that is not IPv4 or IPv6, or (for the uplink programs) IPv4 between two foreign
/// addresses: nobody's but the host's.
fn not_ours(r: &mut Rng, prog: &str) -> Vec<u8> {
    if prog != "from_pod" && r.below(2) == 0 {
        let (src, dst) = (foreign(r), foreign(r));
        let (sp, dp) = (r.next() as u16, r.next() as u16);
        return match r.below(3) {
            0 => tcp_frame(src, sp, dst, dp, SYN),
            1 => udp_frame(src, sp, dst, dp),
            _ => frame(UPLINK_MAC, EXT_MAC, src, dst, ICMP, &echo(8, sp, dp)),
        };
    }
    let ethertype = loop {
        let t = r.next() as u16;
        if t != 0x0800 && t != 0x86dd && t != 0x8100 && t != 0x88a8 {
            break r.pick(&[0x0806, 0x88cc, 0x8847, t]);
        }
    };
    let n = r.below(100) as usize;
    eth(
        r.pick(&[HOST_MAC_A, UPLINK_MAC]),
        EXT_MAC,
        ethertype,
        &r.bytes(n),
    )
}

/// Pads a frame to what `BPF_PROG_TEST_RUN` accepts: the kernel refuses (`EINVAL`) an
/// IPv4 or IPv6 frame shorter than the fixed IP header, before any program runs; such a
/// frame never reaches a tc program on a real device either.
fn runnable(mut f: Vec<u8>, r: &mut Rng) -> Vec<u8> {
    let min = match f.get(12..14) {
        Some([0x08, 0x00]) => 14 + 20,
        Some([0x86, 0xdd]) => 14 + 40,
        _ => 14,
    };
    if f.len() < min {
        let n = min - f.len();
        f.extend(r.bytes(n));
    }
    f
}

fn verdict_known(v: u32) -> bool {
    matches!(v, OK | SHOT | REDIRECT | PASS)
}

#[test]
#[ignore = "needs root and the eBPF object: run via cargo xtask test"]
fn random_and_mutated_frames_through_every_program() {
    let seed = env_u64("CNI_EBPF_PACKET_FUZZ_SEED", 0x11_c0ff_ee15_5eed).max(1);
    let iters = env_u64("CNI_EBPF_PACKET_FUZZ_ITERS", 2000);
    let mut r = Rng(seed);
    let fx = Fixture::with_two_pods();
    let (mut rewritten, mut unchanged_foreign) = (0u64, 0u64);
    for i in 0..iters {
        for prog in ALL_PROGS {
            let what = |kind: &str, pkt: &[u8]| {
                format!("{prog}, frame {i} ({kind}, seed {seed:#x}): {pkt:02x?}")
            };

            // Well-formed: rewritten frames carry right checksums.
            let pkt = well_formed(&mut r);
            let (v, out) = fx.run(prog, &pkt);
            assert!(
                verdict_known(v),
                "{}: verdict {v:#x}",
                what("well-formed", &pkt)
            );
            if v != SHOT && out != pkt {
                rewritten += 1;
                let check = std::panic::catch_unwind(|| parse_checked(&out));
                assert!(
                    check.is_ok(),
                    "{}: rewritten to {out:02x?} with a wrong checksum",
                    what("well-formed", &pkt)
                );
            }

            // Mutated and random: any verdict the programs give, never a failed run.
            let mutated = mutated(&mut r);
            let random = random(&mut r);
            for (kind, pkt) in [("mutated", mutated), ("random", random)] {
                let pkt = runnable(pkt, &mut r);
                let (v, _) = fx.run(prog, &pkt);
                assert!(verdict_known(v), "{}: verdict {v:#x}", what(kind, &pkt));
            }

            // Not ours: passed on unchanged.
            let pkt = not_ours(&mut r, prog);
            let pkt = runnable(pkt, &mut r);
            let (v, out) = fx.run(prog, &pkt);
            assert!(
                v == PASS || v == OK,
                "{}: verdict {v:#x}, expected a pass",
                what("not ours", &pkt)
            );
            assert_eq!(
                out,
                pkt,
                "{}: the frame was modified",
                what("not ours", &pkt)
            );
            unchanged_foreign += 1;
        }
    }
    eprintln!(
        "packet fuzz: {} frames per program (seed {seed:#x}); {rewritten} well-formed frames \
         rewritten with right checksums, {unchanged_foreign} foreign frames passed unchanged",
        iters * 4
    );
    assert!(
        rewritten > 0,
        "no frame was rewritten: the generator misses the datapath"
    );
}
