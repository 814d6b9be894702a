//! A one-shot TCP/UDP client for tests that need the client to be a *process* of its own
//! (e.g. inside a cgroup the test made, where a socket-level eBPF hook applies). The test
//! starts it inside a network namespace and cgroup; it prints the peer's answer.
//!
//! ```text
//! cni-ebpf-netclient tcp ADDR PAYLOAD TIMEOUT_MS   # connect, send, print "from <getpeername>" and everything read until EOF
//! cni-ebpf-netclient udp ADDR PAYLOAD TIMEOUT_MS   # send, print "from <addr>" and the first answer
//! cni-ebpf-netclient udp-sendto ADDR PAYLOAD TIMEOUT_MS   # the same with sendto/recvfrom
//! cni-ebpf-netclient converse ADDR ROUNDS PAUSE_MS   # ROUNDS round trips with an echo server, PAUSE_MS apart
//! ```
//! `ADDR` is `ip:port` (`[v6]:port`). Each step is bounded by `TIMEOUT_MS` (UDP: two
//! tries). The `udp` socket is connected, so an ICMP port-unreachable answer shows as
//! `refused` rather than a timeout. Exit 0 with the answer on stdout, or exit 1 with `error: <kind>: <message>` on
//! stderr (`<kind>` is `timed-out`, `refused`, `unreachable` or `other`); usage errors exit 2.

use std::{
    io::{self, Read, Write},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    process::ExitCode,
    time::Duration,
};

fn kind(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "timed-out",
        io::ErrorKind::ConnectionRefused => "refused",
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => "unreachable",
        _ => "other",
    }
}

fn tcp(to: SocketAddr, payload: &[u8], timeout: Duration) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&to, timeout)?;
    let peer = s.peer_addr()?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(payload)?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(format!("from {peer}\n{out}"))
}

/// UDP to `to`: on a connected socket, or (`connected == false`) with `sendto` on an
/// unconnected one (the answer's source then comes from `recvfrom`).
fn udp(to: SocketAddr, payload: &[u8], timeout: Duration, connected: bool) -> io::Result<String> {
    let bind: SocketAddr = if to.is_ipv6() {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(bind)?;
    if connected {
        s.connect(to)?;
    }
    s.set_read_timeout(Some(timeout))?;
    let mut last = io::Error::from(io::ErrorKind::TimedOut);
    for _ in 0..2 {
        if connected {
            s.send(payload)?;
        } else {
            s.send_to(payload, to)?;
        }
        let mut buf = [0u8; 2048];
        match s.recv_from(&mut buf) {
            Ok((n, from)) => {
                return Ok(format!(
                    "from {from}\n{}",
                    String::from_utf8_lossy(&buf[..n])
                ))
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// `rounds` round trips with an echo server at `to`, `pause` apart, on one connection
/// (each step bounded by two seconds): "from <getpeername>" and how many were made.
fn converse(to: SocketAddr, rounds: u32, pause: Duration) -> io::Result<String> {
    let step = Duration::from_secs(2);
    let mut s = TcpStream::connect_timeout(&to, step)?;
    let peer = s.peer_addr()?;
    s.set_read_timeout(Some(step))?;
    s.set_write_timeout(Some(step))?;
    for i in 0..rounds {
        let msg = format!("round trip {i:08}");
        s.write_all(msg.as_bytes())?;
        let mut back = vec![0u8; msg.len()];
        s.read_exact(&mut back)?;
        if back != msg.as_bytes() {
            return Err(io::Error::other(format!("echo #{i} came back changed")));
        }
        std::thread::sleep(pause);
    }
    Ok(format!("from {peer}\n{rounds} round trips\n"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [proto, addr, payload, timeout_ms] = args.as_slice() else {
        eprintln!("usage: cni-ebpf-netclient tcp|udp|udp-sendto|converse ADDR PAYLOAD TIMEOUT_MS");
        return ExitCode::from(2);
    };
    let (Ok(to), Ok(ms)) = (addr.parse::<SocketAddr>(), timeout_ms.parse::<u64>()) else {
        eprintln!("cni-ebpf-netclient: bad ADDR {addr:?} or TIMEOUT_MS {timeout_ms:?}");
        return ExitCode::from(2);
    };
    let timeout = Duration::from_millis(ms.max(1));
    let res = match proto.as_str() {
        "tcp" => tcp(to, payload.as_bytes(), timeout),
        "udp" => udp(to, payload.as_bytes(), timeout, true),
        "udp-sendto" => udp(to, payload.as_bytes(), timeout, false),
        "converse" => match payload.parse() {
            Ok(rounds) => converse(to, rounds, timeout),
            Err(_) => {
                eprintln!("cni-ebpf-netclient: converse takes a count of round trips");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("cni-ebpf-netclient: protocol must be tcp, udp, udp-sendto or converse, not {proto:?}");
            return ExitCode::from(2);
        }
    };
    match res {
        Ok(answer) => {
            print!("{answer}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}: {e}", kind(&e));
            ExitCode::FAILURE
        }
    }
}
