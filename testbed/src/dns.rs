//! An authoritative DNS server for the simulated cluster: what CoreDNS is to a real one.
//!
//! It answers A, AAAA and CNAME questions from a table the test fills and changes while it
//! runs ([`DnsServer::set`]), over UDP and TCP on port 53 of both families in a namespace
//! (a pod's, behind a `kube-dns` Service). Names are matched case-insensitively; a name
//! starting with `*.` answers every name below it that has no record of its own. A CNAME
//! is followed within the table, its target's records added to the answer, as a recursive
//! server hands them to a stub resolver. Unknown names get NXDOMAIN, known names without a
//! record of the asked type an empty answer (NODATA). A UDP answer longer than 512 bytes
//! (the limit without EDNS) is cut to its header and question with the TC bit set, so the
//! client asks again over TCP. Every question is logged ([`DnsServer::questions`]).
//!
//! The wire format is RFC 1035's: written here for the few record types the tests need.

use std::{
    collections::BTreeMap,
    io::{self, Read, Write},
    net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use crate::net::in_netns;

/// How often a server thread looks at its stop flag.
const TICK: Duration = Duration::from_millis(100);

/// QTYPE / TYPE values.
pub const TYPE_A: u16 = 1;
/// CNAME.
pub const TYPE_CNAME: u16 = 5;
/// AAAA.
pub const TYPE_AAAA: u16 = 28;

/// The largest UDP answer without EDNS (RFC 1035 §4.2.1).
const UDP_LIMIT: usize = 512;

/// One record of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// An address (A for IPv4, AAAA for IPv6), with its TTL in seconds.
    Addr(IpAddr, u32),
    /// An alias, with its TTL in seconds.
    Cname(String, u32),
}

/// A question the server received: the name as asked, its type, and whether it came over
/// TCP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The name, lower-case, without the trailing dot.
    pub name: String,
    /// QTYPE.
    pub qtype: u16,
    /// Over TCP (else UDP).
    pub tcp: bool,
}

type Table = Arc<Mutex<BTreeMap<String, Vec<Record>>>>;

/// The server, stopped and joined on drop.
#[derive(Debug)]
pub struct DnsServer {
    table: Table,
    questions: Arc<Mutex<Vec<Question>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl DnsServer {
    /// Starts the server on port 53 (UDP and TCP, both families) in `netns`, with an empty
    /// table. Panics if it cannot bind.
    #[track_caller]
    #[must_use]
    pub fn start(netns: &Path) -> Self {
        let bind = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 53));
        let (udp, tcp) = in_netns(netns, move || {
            (UdpSocket::bind(bind), TcpListener::bind(bind))
        });
        let udp = udp.unwrap_or_else(|e| panic!("DNS server UDP in {}: {e}", netns.display()));
        let tcp = tcp.unwrap_or_else(|e| panic!("DNS server TCP in {}: {e}", netns.display()));
        let table: Table = Arc::default();
        let questions: Arc<Mutex<Vec<Question>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        {
            let (t, q, s) = (
                Arc::clone(&table),
                Arc::clone(&questions),
                Arc::clone(&stop),
            );
            threads.push(thread::spawn(move || serve_udp(&udp, &t, &q, &s)));
        }
        {
            let (t, q, s) = (
                Arc::clone(&table),
                Arc::clone(&questions),
                Arc::clone(&stop),
            );
            threads.push(thread::spawn(move || serve_tcp(&tcp, &t, &q, &s)));
        }
        Self {
            table,
            questions,
            stop,
            threads,
        }
    }

    /// Makes `records` the answer for `name` (replacing what it had; empty: the name is
    /// removed). `name` may start with `*.`.
    pub fn set(&self, name: &str, records: Vec<Record>) {
        let key = normalize(name);
        let mut t = self
            .table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if records.is_empty() {
            t.remove(&key);
        } else {
            t.insert(key, records);
        }
    }

    /// The questions received so far, in order.
    #[must_use]
    pub fn questions(&self) -> Vec<Question> {
        self.questions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn serve_udp(sock: &UdpSocket, table: &Table, questions: &Mutex<Vec<Question>>, stop: &AtomicBool) {
    let _ = sock.set_read_timeout(Some(TICK));
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        if let Some(mut answer) = respond(&buf[..n], table, questions, false) {
            if answer.len() > UDP_LIMIT {
                answer = truncated(&answer);
            }
            let _ = sock.send_to(&answer, from);
        }
    }
}

fn serve_tcp(
    listener: &TcpListener,
    table: &Table,
    questions: &Mutex<Vec<Question>>,
    stop: &AtomicBool,
) {
    let _ = listener.set_nonblocking(true);
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                let _ = serve_conn(conn, table, questions);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(TICK / 10),
            Err(_) => thread::sleep(TICK),
        }
    }
}

/// One TCP connection: length-prefixed messages until the client closes (bounded by a
/// read timeout).
fn serve_conn(
    mut conn: TcpStream,
    table: &Table,
    questions: &Mutex<Vec<Question>>,
) -> io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    loop {
        let mut len = [0u8; 2];
        conn.read_exact(&mut len)?;
        let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
        conn.read_exact(&mut msg)?;
        let Some(answer) = respond(&msg, table, questions, true) else {
            return Ok(());
        };
        let n = u16::try_from(answer.len()).unwrap_or(u16::MAX);
        conn.write_all(&n.to_be_bytes())?;
        conn.write_all(&answer)?;
    }
}

/// The answer to query `msg`, or `None` when it is not one we can read.
fn respond(
    msg: &[u8],
    table: &Table,
    questions: &Mutex<Vec<Question>>,
    tcp: bool,
) -> Option<Vec<u8>> {
    if msg.len() < 12 || msg[2] & 0x80 != 0 || u16::from_be_bytes([msg[4], msg[5]]) != 1 {
        return None;
    }
    let (qname, end) = read_name(msg, 12)?;
    let qtype = u16::from_be_bytes([*msg.get(end)?, *msg.get(end + 1)?]);
    let question = &msg[12..end + 4];
    if let Ok(mut q) = questions.lock() {
        q.push(Question {
            name: qname.clone(),
            qtype,
            tcp,
        });
    }
    let table = table
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut answers: Vec<(String, Record)> = Vec::new();
    let mut name = qname;
    let mut known = false;
    // Follow CNAMEs within the table (a bounded chain: no loop can hold the server).
    for _ in 0..8 {
        let Some(records) = lookup(&table, &name) else {
            break;
        };
        known = true;
        let mut next = None;
        for r in records {
            match r {
                Record::Cname(target, _) if qtype != TYPE_CNAME => {
                    answers.push((name.clone(), r.clone()));
                    next = Some(normalize(target));
                }
                Record::Cname(..) => answers.push((name.clone(), r.clone())),
                Record::Addr(IpAddr::V4(_), _) if qtype == TYPE_A => {
                    answers.push((name.clone(), r.clone()));
                }
                Record::Addr(IpAddr::V6(_), _) if qtype == TYPE_AAAA => {
                    answers.push((name.clone(), r.clone()));
                }
                Record::Addr(..) => {}
            }
        }
        match next {
            Some(n) => name = n,
            None => break,
        }
    }
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&msg[0..2]);
    // QR, opcode 0, AA, RD copied; RA; RCODE NXDOMAIN for an unknown name.
    out.push(0x84 | (msg[2] & 0x01));
    out.push(0x80 | if known { 0 } else { 3 });
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&u16::try_from(answers.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(question);
    for (owner, r) in &answers {
        write_name(&mut out, owner);
        let (ty, ttl, data) = match r {
            Record::Addr(IpAddr::V4(a), ttl) => (TYPE_A, *ttl, a.octets().to_vec()),
            Record::Addr(IpAddr::V6(a), ttl) => (TYPE_AAAA, *ttl, a.octets().to_vec()),
            Record::Cname(target, ttl) => {
                let mut d = Vec::new();
                write_name(&mut d, &normalize(target));
                (TYPE_CNAME, *ttl, d)
            }
        };
        out.extend_from_slice(&ty.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&u16::try_from(data.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&data);
    }
    Some(out)
}

/// The records of `name`: its own, else those of the closest `*.` wildcard above it.
fn lookup<'a>(table: &'a BTreeMap<String, Vec<Record>>, name: &str) -> Option<&'a Vec<Record>> {
    if let Some(r) = table.get(name) {
        return Some(r);
    }
    let mut rest = name;
    while let Some((_, parent)) = rest.split_once('.') {
        if let Some(r) = table.get(&format!("*.{parent}")) {
            return Some(r);
        }
        rest = parent;
    }
    None
}

/// `answer` cut to its header and question, TC set and no records.
fn truncated(answer: &[u8]) -> Vec<u8> {
    let end = read_name(answer, 12).map_or(answer.len(), |(_, e)| e + 4);
    let mut out = answer[..end.min(answer.len())].to_vec();
    out[2] |= 0x02;
    for b in &mut out[6..12] {
        *b = 0;
    }
    out
}

/// The uncompressed name at `off` (questions are never compressed) and the offset after it.
fn read_name(msg: &[u8], mut off: usize) -> Option<(String, usize)> {
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*msg.get(off)?);
        if len == 0 {
            return Some((labels.join(".").to_ascii_lowercase(), off + 1));
        }
        if len & 0xc0 != 0 {
            return None;
        }
        labels.push(String::from_utf8_lossy(msg.get(off + 1..off + 1 + len)?).into_owned());
        off += 1 + len;
    }
}

fn write_name(out: &mut Vec<u8>, name: &str) {
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(u8::try_from(label.len()).unwrap_or(63).min(63));
        out.extend_from_slice(&label.as_bytes()[..label.len().min(63)]);
    }
    out.push(0);
}

#[cfg(test)]
#[expect(clippy::expect_used, reason = "tests")]
mod tests {
    use std::{collections::BTreeMap, net::IpAddr, sync::Mutex};

    use super::{read_name, respond, Record, Table, TYPE_A, TYPE_AAAA};

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        super::write_name(&mut q, name);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&1u16.to_be_bytes());
        q
    }

    fn table(entries: &[(&str, Vec<Record>)]) -> Table {
        let mut t = BTreeMap::new();
        for (n, r) in entries {
            t.insert((*n).to_owned(), r.clone());
        }
        std::sync::Arc::new(Mutex::new(t))
    }

    /// The answer's RCODE and its records' (type, data) in order.
    fn read_answer(a: &[u8]) -> (u8, Vec<(u16, Vec<u8>)>) {
        let count = u16::from_be_bytes([a[6], a[7]]);
        let (_, mut off) = read_name(a, 12).expect("question");
        off += 4;
        let mut out = Vec::new();
        for _ in 0..count {
            let (_, end) = read_name(a, off).expect("owner");
            let ty = u16::from_be_bytes([a[end], a[end + 1]]);
            let len = usize::from(u16::from_be_bytes([a[end + 8], a[end + 9]]));
            out.push((ty, a[end + 10..end + 10 + len].to_vec()));
            off = end + 10 + len;
        }
        (a[3] & 0x0f, out)
    }

    #[test]
    fn answers_follow_cnames_wildcards_and_types() {
        let v4: IpAddr = "10.96.0.10".parse().expect("v4");
        let v6: IpAddr = "fd00:10:96::10".parse().expect("v6");
        let t = table(&[
            (
                "web.default.svc.cluster.local",
                vec![Record::Addr(v4, 5), Record::Addr(v6, 5)],
            ),
            (
                "alias.example",
                vec![Record::Cname("web.default.svc.cluster.local".into(), 30)],
            ),
            ("*.wild.example", vec![Record::Addr(v4, 7)]),
        ]);
        let log = Mutex::new(Vec::new());
        let a = respond(
            &query("WEB.default.svc.cluster.local", TYPE_A),
            &t,
            &log,
            false,
        )
        .expect("answer");
        assert_eq!(read_answer(&a), (0, vec![(TYPE_A, vec![10, 96, 0, 10])]));
        let a = respond(&query("alias.example", TYPE_AAAA), &t, &log, false).expect("answer");
        let (rcode, records) = read_answer(&a);
        assert_eq!(rcode, 0);
        assert_eq!(records.len(), 2, "the CNAME and the target's AAAA");
        assert_eq!(records[1].0, TYPE_AAAA);
        let a = respond(&query("x.y.wild.example", TYPE_A), &t, &log, false).expect("answer");
        assert_eq!(read_answer(&a).1.len(), 1);
        let a = respond(&query("nowhere.example", TYPE_A), &t, &log, false).expect("answer");
        assert_eq!(read_answer(&a), (3, vec![]), "NXDOMAIN");
        assert_eq!(log.lock().expect("log").len(), 4);
    }
}
