//! A one-shot TCP/UDP client for tests that need the client to be a *process* of its own
//! (e.g. inside a cgroup the test made, where a socket-level eBPF hook applies). The test
//! starts it inside a network namespace and cgroup; it prints the peer's answer.
//!
//! ```text
//! cni-ebpf-netclient tcp ADDR PAYLOAD TIMEOUT_MS   # connect, send (nothing if PAYLOAD is empty), print "from <getpeername>" and everything read until EOF
//! cni-ebpf-netclient udp ADDR PAYLOAD TIMEOUT_MS   # send, print "from <addr>" and the first answer
//! cni-ebpf-netclient udp-sendto ADDR PAYLOAD TIMEOUT_MS   # the same with sendto/recvfrom
//! cni-ebpf-netclient converse ADDR ROUNDS PAUSE_MS   # ROUNDS round trips with an echo server, PAUSE_MS apart
//! cni-ebpf-netclient resolve NAME RESOLV_CONF TIMEOUT_MS   # getaddrinfo(NAME) with RESOLV_CONF as /etc/resolv.conf: one address per line
//! cni-ebpf-netclient serve-probes   # reads "ID tcp|udp ADDR PAYLOAD|- TIMEOUT_MS" lines, answers "ID ok|fail" as each ends
//! ```
//! `serve-probes` runs many `tcp` and `udp` attempts from one process, each on a thread of
//! its own (`-`: no payload), until its input ends: a long-lived client for tests that
//! probe a matrix of peers from inside a cgroup, without a process per probe.
//! `resolve` runs the C library's resolver as any program does, with the resolver
//! configuration of a pod (a `nameserver` that is the cluster DNS Service): the file is
//! bind-mounted over `/etc/resolv.conf` in a mount namespace of the process's own, so
//! nothing outside it changes.
//! `ADDR` is `ip:port` (`[v6]:port`). Each step is bounded by `TIMEOUT_MS` (UDP: two
//! tries). With `CNI_EBPF_NETCLIENT_BIND=<ip>` in its environment, the `tcp` and `udp`
//! sockets are bound to that source address first (as `curl --interface <ip>` does). The `udp` socket is connected, so an ICMP port-unreachable answer shows as
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

/// The source address `CNI_EBPF_NETCLIENT_BIND` names, if any.
fn bind_source() -> io::Result<Option<std::net::IpAddr>> {
    match std::env::var("CNI_EBPF_NETCLIENT_BIND") {
        Ok(ip) => ip
            .parse()
            .map(Some)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("bad source {ip:?}"))),
        Err(_) => Ok(None),
    }
}

fn tcp(to: SocketAddr, payload: &[u8], timeout: Duration) -> io::Result<String> {
    let mut s = match bind_source()? {
        None => TcpStream::connect_timeout(&to, timeout)?,
        Some(ip) => {
            use socket2::{Domain, Socket, Type};
            let sock = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
            sock.bind(&SocketAddr::new(ip, 0).into())?;
            sock.connect_timeout(&to.into(), timeout)?;
            sock.into()
        }
    };
    let peer = s.peer_addr()?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    // An empty payload sends nothing: the server speaks first.
    if !payload.is_empty() {
        s.write_all(payload)?;
    }
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(format!("from {peer}\n{out}"))
}

/// UDP to `to`: on a connected socket, or (`connected == false`) with `sendto` on an
/// unconnected one (the answer's source then comes from `recvfrom`).
fn udp(to: SocketAddr, payload: &[u8], timeout: Duration, connected: bool) -> io::Result<String> {
    let bind: SocketAddr = match bind_source()? {
        Some(ip) => (ip, 0).into(),
        None if to.is_ipv6() => (Ipv6Addr::UNSPECIFIED, 0).into(),
        None => (Ipv4Addr::UNSPECIFIED, 0).into(),
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

/// The addresses of `name` from the C library's resolver (`getaddrinfo`), with
/// `resolv_conf` in place of `/etc/resolv.conf`; bounded by `timeout`.
fn resolve(name: &str, resolv_conf: &str, timeout: Duration) -> io::Result<String> {
    use nix::{
        mount::{mount, MsFlags},
        sched::{unshare, CloneFlags},
    };
    use std::net::ToSocketAddrs;

    unshare(CloneFlags::CLONE_NEWNS).map_err(io::Error::from)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(io::Error::from)?;
    mount(
        Some(resolv_conf),
        "/etc/resolv.conf",
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(io::Error::from)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let name = name.to_owned();
    std::thread::spawn(move || {
        let _ = tx.send(
            (name.as_str(), 0)
                .to_socket_addrs()
                .map(Iterator::collect::<Vec<_>>),
        );
    });
    let addrs = rx
        .recv_timeout(timeout)
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    let mut out = String::new();
    for a in addrs {
        out.push_str(&a.ip().to_string());
        out.push('\n');
    }
    Ok(out)
}

/// `serve-probes`: one attempt per input line, its outcome written as it ends.
fn serve_probes() -> ExitCode {
    use std::io::BufRead;
    let out = std::sync::Arc::new(std::sync::Mutex::new(io::stdout()));
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else {
            break;
        };
        let f: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        let out = std::sync::Arc::clone(&out);
        std::thread::spawn(move || {
            let [id, proto, addr, payload, ms] = f.as_slice() else {
                return;
            };
            let payload = if payload == "-" { "" } else { payload.as_str() };
            let ok = match (addr.parse::<SocketAddr>(), ms.parse::<u64>()) {
                (Ok(to), Ok(ms)) => {
                    let t = Duration::from_millis(ms.max(1));
                    match proto.as_str() {
                        "tcp" => tcp(to, payload.as_bytes(), t).is_ok(),
                        "udp" => udp(to, payload.as_bytes(), t, true).is_ok(),
                        _ => false,
                    }
                }
                _ => false,
            };
            if let Ok(mut o) = out.lock() {
                let _ = writeln!(o, "{id} {}", if ok { "ok" } else { "fail" });
                let _ = o.flush();
            }
        });
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "serve-probes") {
        return serve_probes();
    }
    if let [proto, name, conf, timeout_ms] = args.as_slice() {
        if proto == "resolve" {
            let Ok(ms) = timeout_ms.parse::<u64>() else {
                eprintln!("cni-ebpf-netclient: bad TIMEOUT_MS {timeout_ms:?}");
                return ExitCode::from(2);
            };
            return report(resolve(name, conf, Duration::from_millis(ms.max(1))));
        }
    }
    let [proto, addr, payload, timeout_ms] = args.as_slice() else {
        eprintln!("usage: cni-ebpf-netclient tcp|udp|udp-sendto|converse ADDR PAYLOAD TIMEOUT_MS | resolve NAME RESOLV_CONF TIMEOUT_MS");
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
            eprintln!("cni-ebpf-netclient: protocol must be tcp, udp, udp-sendto, converse or resolve, not {proto:?}");
            return ExitCode::from(2);
        }
    };
    report(res)
}

/// The answer on stdout (exit 0), or the error on stderr (exit 1).
fn report(res: io::Result<String>) -> ExitCode {
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
