//! Traffic control through rtnetlink, synchronously: which filters a device's clsact
//! hooks run (to tell whether our programs are attached as legacy filters), removing one
//! of them, and the device's qdiscs (`fq` at the root where paced packets leave).
//!
//! Synchronous because the callers sit on both sides of the async netlink code (inside
//! ADD's runtime and outside it); each call is one round trip on its own socket (a pod's
//! qdisc and both its filters go in one datagram: [`attach_filters`]).

use std::io;

use netlink_packet_core::{
    NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE,
    NLM_F_REQUEST,
};
use netlink_packet_route::{
    tc::{TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcMessage, TcOption},
    RouteNetlinkMessage,
};
use netlink_sys::protocols::NETLINK_ROUTE;

use super::netlink::{messages, Netlink};

/// The clsact hook a filter sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `ffff:fff2`: packets the device receives.
    Ingress,
    /// `ffff:fff3`: packets the device sends.
    Egress,
}

impl Hook {
    fn parent(self) -> TcHandle {
        TcHandle {
            major: 0xffff,
            minor: match self {
                Self::Ingress => TcHandle::MIN_INGRESS,
                Self::Egress => TcHandle::MIN_EGRESS,
            },
        }
    }
}

/// One filter of a clsact hook, as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// Priority (lower runs first).
    pub priority: u16,
    /// Filter handle within the priority.
    pub handle: u32,
    /// Classifier kind (`bpf`, `u32`, `matchall`, …).
    pub kind: String,
    /// For `bpf` filters: the program's kernel id.
    pub prog_id: Option<u32>,
    /// For `bpf` filters: the name tc shows.
    pub prog_name: Option<String>,
}

/// One qdisc of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    /// Its handle (`major:minor` packed).
    pub handle: u32,
    /// Its parent (`TC_H_ROOT` for the root qdisc).
    pub parent: u32,
    /// Kind (`fq`, `noqueue`, `clsact`, `ingress`, `tbf`, …).
    pub kind: String,
}

/// `TC_H_ROOT`.
pub const ROOT: u32 = 0xffff_ffff;

/// The filters on `hook` of `ifindex`. A device without a clsact (or ingress) qdisc has
/// none: the kernel answers `EINVAL`, which is returned as an empty list.
pub fn filters(ifindex: u32, hook: Hook) -> io::Result<Vec<Filter>> {
    let mut msg = TcMessage::with_index(index(ifindex)?);
    msg.header.parent = hook.parent();
    let replies = match request(
        RouteNetlinkMessage::GetTrafficFilter(msg),
        NLM_F_REQUEST | NLM_F_DUMP,
    ) {
        Ok(r) => r,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for reply in replies {
        let RouteNetlinkMessage::NewTrafficFilter(m) = reply else {
            continue;
        };
        // A priority's head entry (no handle) describes the chain, not a filter.
        if u32::from(m.header.handle) == 0 {
            continue;
        }
        let mut f = Filter {
            priority: u16::try_from(m.header.info >> 16).unwrap_or(0),
            handle: u32::from(m.header.handle),
            kind: String::new(),
            prog_id: None,
            prog_name: None,
        };
        for attr in &m.attributes {
            match attr {
                TcAttribute::Kind(k) => f.kind.clone_from(k),
                TcAttribute::Options(opts) => {
                    for o in opts {
                        match o {
                            TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => f.prog_id = Some(*id),
                            TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => {
                                f.prog_name = Some(n.clone());
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        out.push(f);
    }
    Ok(out)
}

/// Deletes the filter at (`priority`, `handle`) on `hook` of `ifindex`; a filter or a
/// clsact qdisc that is not there is fine.
pub fn delete_filter(ifindex: u32, hook: Hook, priority: u16, handle: u32) -> io::Result<()> {
    let mut msg = TcMessage::with_index(index(ifindex)?);
    msg.header.parent = hook.parent();
    msg.header.handle = handle.into();
    msg.header.info = filter_info(priority);
    msg.attributes.push(TcAttribute::Kind("bpf".into()));
    match request(
        RouteNetlinkMessage::DelTrafficFilter(msg),
        NLM_F_REQUEST | NLM_F_ACK,
    ) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The qdiscs of `ifindex`.
pub fn qdiscs(ifindex: u32) -> io::Result<Vec<Qdisc>> {
    let msg = TcMessage::with_index(index(ifindex)?);
    let replies = request(
        RouteNetlinkMessage::GetQueueDiscipline(msg),
        NLM_F_REQUEST | NLM_F_DUMP,
    )?;
    Ok(replies
        .into_iter()
        .filter_map(|r| match r {
            RouteNetlinkMessage::NewQueueDiscipline(m)
                if m.header.index == index_lossy(ifindex) =>
            {
                let kind = m.attributes.iter().find_map(|a| match a {
                    TcAttribute::Kind(k) => Some(k.clone()),
                    _ => None,
                })?;
                Some(Qdisc {
                    handle: u32::from(m.header.handle),
                    parent: u32::from(m.header.parent),
                    kind,
                })
            }
            _ => None,
        })
        .collect())
}

/// Makes `kind` (which must take no options, e.g. `fq` with its defaults) the qdisc at
/// `parent` of `ifindex` ([`ROOT`], or a class of a multiqueue root), replacing whatever
/// was there.
pub fn replace_qdisc(ifindex: u32, parent: u32, kind: &str) -> io::Result<()> {
    let mut msg = TcMessage::with_index(index(ifindex)?);
    msg.header.parent = TcHandle::from(parent);
    msg.header.handle = TcHandle::from(0);
    msg.attributes.push(TcAttribute::Kind(kind.into()));
    request(
        RouteNetlinkMessage::NewQueueDiscipline(msg),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
    )
    .map(|_| ())
}

/// One `bpf` filter to attach ([`attach_filters`]).
#[derive(Debug, Clone, Copy)]
pub struct BpfFilter<'a> {
    /// The clsact hook.
    pub hook: Hook,
    /// A descriptor of the program (the filter takes its own reference).
    pub prog_fd: std::os::fd::BorrowedFd<'a>,
    /// The name `tc filter show` gives it.
    pub name: &'a str,
}

/// Puts a clsact qdisc on `ifindex` (one already there is kept) and on it each of
/// `filters` as a direct-action `bpf` filter at (`priority`, `handle`) of its hook; a
/// filter already at that place is replaced in place, so packets never find the hook
/// empty. Every request goes in one datagram: one round trip for all.
pub fn attach_filters(
    ifindex: u32,
    priority: u16,
    handle: u32,
    filters: &[BpfFilter<'_>],
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let index = index(ifindex)?;
    let mut qdisc = TcMessage::with_index(index);
    qdisc.header.parent = TcHandle::from(CLSACT);
    qdisc.header.handle = TcHandle::from(0xffff_0000);
    qdisc.attributes.push(TcAttribute::Kind("clsact".into()));
    let mut batch = vec![(
        RouteNetlinkMessage::NewQueueDiscipline(qdisc),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
    )];
    for f in filters {
        let mut msg = TcMessage::with_index(index);
        msg.header.parent = f.hook.parent();
        msg.header.handle = handle.into();
        msg.header.info = filter_info(priority);
        msg.attributes.push(TcAttribute::Kind("bpf".into()));
        msg.attributes.push(TcAttribute::Options(vec![
            TcOption::Bpf(TcFilterBpfOption::ProgFd(
                f.prog_fd.as_raw_fd().unsigned_abs(),
            )),
            TcOption::Bpf(TcFilterBpfOption::ProgName(f.name.to_owned())),
            TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
        ]));
        batch.push((
            RouteNetlinkMessage::NewTrafficFilter(msg),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        ));
    }
    requests(batch)
}

/// `TC_H_CLSACT`: the parent of a clsact qdisc.
const CLSACT: u32 = 0xffff_fff1;

/// A filter's `tcm_info`: its priority and protocol (all, network order).
fn filter_info(priority: u16) -> u32 {
    u32::from(priority) << 16 | u32::from(u16::to_be(libc::ETH_P_ALL as u16))
}

fn index(ifindex: u32) -> io::Result<i32> {
    i32::try_from(ifindex).map_err(|_| io::Error::from_raw_os_error(libc::ENODEV))
}

fn index_lossy(ifindex: u32) -> i32 {
    i32::try_from(ifindex).unwrap_or(-1)
}

/// Sends one request and collects the replies up to the dump's end or the ack. A netlink
/// error becomes an `io::Error` with its errno.
fn request(payload: RouteNetlinkMessage, flags: u16) -> io::Result<Vec<RouteNetlinkMessage>> {
    Netlink::connect(NETLINK_ROUTE)?.request(payload, flags)
}

/// Appends request `payload` with `flags` and sequence number `seq` to `buf`.
fn encode(buf: &mut Vec<u8>, payload: RouteNetlinkMessage, flags: u16, seq: u32) {
    let mut msg = NetlinkMessage::from(payload);
    msg.header.flags = flags;
    msg.header.sequence_number = seq;
    msg.finalize();
    let start = buf.len();
    buf.resize(start + msg.buffer_len(), 0);
    msg.serialize(&mut buf[start..]);
}

/// Sends requests that each end in an ack (no dumps) in one datagram, numbered from 1;
/// the kernel handles them in order. The first one that failed, as an `io::Error` with
/// its errno (those after it were still tried).
fn requests(batch: Vec<(RouteNetlinkMessage, u16)>) -> io::Result<()> {
    let nl = Netlink::connect(NETLINK_ROUTE)?;
    let mut buf = Vec::new();
    let count = batch.len();
    for (seq, (payload, flags)) in (1..).zip(batch) {
        encode(&mut buf, payload, flags, seq);
    }
    nl.socket().send(&buf, 0)?;
    let mut acked = 0;
    let mut first_error: Option<(u32, io::Error)> = None;
    while acked < count {
        let (data, _) = nl.socket().recv_from_full()?;
        for m in messages::<RouteNetlinkMessage>(&data)? {
            let NetlinkPayload::Error(e) = m.payload else {
                continue;
            };
            acked += 1;
            if let Some(code) = e.code {
                let seq = m.header.sequence_number;
                if first_error.as_ref().is_none_or(|(s, _)| seq < *s) {
                    first_error = Some((seq, io::Error::from_raw_os_error(-code.get())));
                }
            }
        }
    }
    match first_error {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}
