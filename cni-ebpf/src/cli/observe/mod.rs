//! `cni-ebpf observe`: the flows of one node's agent, of several, or of every node of the
//! cluster (found through the API server: each Node's InternalIP, at the agents'
//! `--agent-port`), merged in time order, as text or JSON lines; `--follow` streams them
//! as they come; `--ui` serves the live map of who talks to whom ([`ui`]) on this
//! machine, from the same nodes.
//!
//! Each agent checks the reader (`--flows-auth`): the token given (`--token`,
//! `--token-file`), else the one the API credentials carry (the ServiceAccount's, the
//! kubeconfig user's). With `--flows-ca` the agents are read over HTTPS, each one's
//! certificate checked against that CA (for its address, or `--flows-server-name`); the
//! token is never sent to an agent that does not prove itself. A node that cannot be read
//! is named on stderr and the others are shown.

pub mod ui;

use std::{io::Write as _, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use futures::{stream::select_all, StreamExt as _};
use http_body_util::{BodyExt as _, Empty};
use hyper::{body::Bytes, Request, StatusCode};
use hyper_util::rt::TokioIo;

use crate::{
    agent::flows::{
        record::Flow,
        serve::now_unix_nano,
        window::{parse_time, Filter},
    },
    error::{Error, Result},
    k8s::{credentials, ApiArgs, ApiClient},
};

/// The port the agents serve flows on (the DaemonSet's `--flows-listen`).
pub const DEFAULT_AGENT_PORT: u16 = 9672;

/// `cni-ebpf observe`.
#[derive(Debug, Clone, clap::Args)]
pub struct ObserveArgs {
    /// An agent to read (`<address>:<port>`, repeatable; default: the node's own,
    /// `127.0.0.1:9672`).
    #[arg(long = "node")]
    pub nodes: Vec<String>,
    /// Read every node of the cluster: the Nodes' InternalIPs from the API server, at
    /// `--agent-port`.
    #[arg(long)]
    pub all_nodes: bool,
    /// The port of the agents found with `--all-nodes`.
    #[arg(long, default_value_t = DEFAULT_AGENT_PORT)]
    pub agent_port: u16,
    /// The bearer token to present (default: the API credentials').
    #[arg(long, env = "CNI_EBPF_OBSERVE_TOKEN", conflicts_with = "token_file")]
    pub token: Option<String>,
    /// A file holding the token to present.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Read the agents over HTTPS, trusting only this CA (PEM) for their certificates
    /// (the agents' `--flows-tls-cert`).
    #[arg(long)]
    pub flows_ca: Option<PathBuf>,
    /// The name the agents' certificates must hold (default: the address each is read at).
    #[arg(long, requires = "flows_ca")]
    pub flows_server_name: Option<String>,
    /// Keep streaming new flows as they come.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only flows since this time (RFC 3339, or a duration ago: 30s, 5m, 2h).
    #[arg(long)]
    pub since: Option<String>,
    /// Only the last N flows (of all nodes together).
    #[arg(long)]
    pub last: Option<usize>,
    /// `text` (one line each) or `json` (one JSON object per line).
    #[arg(long, short = 'o', default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// A pod on either side (`namespace/name`, or `name`).
    #[arg(long)]
    pub pod: Option<String>,
    /// Either side in this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Either side a pod of this workload (`Deployment/web` or `web`).
    #[arg(long)]
    pub workload: Option<String>,
    /// Either side this Service (as addressed).
    #[arg(long)]
    pub service: Option<String>,
    /// `egress`, `ingress` or `node`.
    #[arg(long)]
    pub direction: Option<String>,
    /// `forwarded` or `dropped`.
    #[arg(long)]
    pub verdict: Option<String>,
    /// `start`, `end` or `drop`.
    #[arg(long)]
    pub kind: Option<String>,
    /// `TCP`, `UDP`, `SCTP`, `ICMP`, `ICMPv6`.
    #[arg(long)]
    pub protocol: Option<String>,
    /// Either side's port.
    #[arg(long)]
    pub port: Option<u16>,
    /// A drop's or an end's reason (`drop_policy_ingress`, `expired`).
    #[arg(long)]
    pub reason: Option<String>,
    /// Serve the live map on `--ui-listen` instead of printing.
    #[arg(long)]
    pub ui: bool,
    /// Where `--ui` serves the page.
    #[arg(long, default_value = "127.0.0.1:9680", value_parser = crate::agent::http::parse_listen)]
    pub ui_listen: SocketAddr,
    #[command(flatten)]
    pub api: ApiArgs,
}

impl ObserveArgs {
    /// The filter the options ask for.
    ///
    /// # Errors
    /// A value that does not parse, named.
    pub fn filter(&self) -> Result<Filter> {
        let now = now_unix_nano();
        let since = self
            .since
            .as_deref()
            .map(|s| {
                parse_time(s, now).ok_or_else(|| {
                    Error::config(
                        "--since",
                        format!("{s:?} is not RFC 3339 or a duration (30s, 5m, 2h)"),
                    )
                })
            })
            .transpose()?;
        let f = Filter {
            pod: self.pod.clone(),
            namespace: self.namespace.clone(),
            workload: self.workload.clone(),
            service: self.service.clone(),
            direction: self.direction.clone(),
            verdict: self.verdict.clone(),
            kind: self.kind.clone(),
            protocol: self.protocol.clone(),
            port: self.port,
            reason: self.reason.clone(),
            since_unix_nano: since,
            until_unix_nano: None,
            last: self.last,
        };
        // Checked as an agent would check it.
        Filter::from_query(&f.to_query(false), now).map_err(|e| Error::config("observe", e))?;
        Ok(f)
    }
}

/// Runs `cni-ebpf observe`.
///
/// # Errors
/// Bad options, no node to read, or (`--ui`) a listener that cannot be bound.
pub fn run(args: &ObserveArgs) -> Result<()> {
    let filter = args.filter()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the runtime", e))?;
    runtime.block_on(async {
        let readers = Readers::new(args).await?;
        if args.ui {
            return ui::serve(args.ui_listen, readers).await;
        }
        let mut out = std::io::stdout().lock();
        let json = args.output == "json";
        let mut print = |f: &Flow| {
            let line = if json {
                serde_json::to_string(f).unwrap_or_default()
            } else {
                f.text()
            };
            // A closed pipe (`| head`) ends the output.
            writeln!(out, "{line}").is_ok() && out.flush().is_ok()
        };
        if !args.follow {
            let (flows, failed) = readers.query(&filter).await;
            if failed == readers.nodes.len() {
                return Err(Error::config(
                    "observe",
                    "no node could be read (see above)",
                ));
            }
            for f in flows {
                if !print(&f) {
                    break;
                }
            }
            return Ok(());
        }
        let (mut live, opened) = readers.follow(&filter).await;
        if opened == 0 {
            return Err(Error::config(
                "observe",
                "no node could be read (see above)",
            ));
        }
        while let Some(f) = live.next().await {
            if !print(&f) {
                break;
            }
        }
        Ok(())
    })
}

/// The agents read, the token presented to them, and how they are trusted.
#[derive(Debug, Clone)]
pub struct Readers {
    nodes: Vec<String>,
    token: Option<Arc<str>>,
    tls: Option<Tls>,
}

/// HTTPS to the agents: the CA their certificates are checked with, and the name they
/// must hold (`None`: the address read).
#[derive(Clone)]
struct Tls {
    connector: tokio_rustls::TlsConnector,
    name: Option<rustls::pki_types::ServerName<'static>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Tls {
    fn new(args: &ObserveArgs) -> Result<Option<Self>> {
        let Some(ca) = &args.flows_ca else {
            return Ok(None);
        };
        let pem = std::fs::read(ca)
            .map_err(|e| Error::io(format!("reading --flows-ca {}", ca.display()), e))?;
        let config = crate::tls::client_trusting(&pem)
            .map_err(|e| Error::config("--flows-ca", format!("{}: {e}", ca.display())))?;
        let name = args
            .flows_server_name
            .as_deref()
            .map(|n| {
                rustls::pki_types::ServerName::try_from(n.to_owned())
                    .map_err(|e| Error::config("--flows-server-name", format!("{n:?}: {e}")))
            })
            .transpose()?;
        Ok(Some(Self {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            name,
        }))
    }

    /// The name `node` (`host:port`) must prove.
    fn name_of(
        &self,
        node: &str,
    ) -> std::result::Result<rustls::pki_types::ServerName<'static>, String> {
        if let Some(n) = &self.name {
            return Ok(n.clone());
        }
        let host = node
            .parse::<SocketAddr>()
            .map(|a| a.ip().to_string())
            .unwrap_or_else(|_| node.rsplit_once(':').map_or(node, |(h, _)| h).to_owned());
        rustls::pki_types::ServerName::try_from(host).map_err(|e| e.to_string())
    }
}

impl Readers {
    async fn new(args: &ObserveArgs) -> Result<Self> {
        let mut nodes = args.nodes.clone();
        if args.all_nodes {
            nodes.extend(cluster_nodes(&args.api, args.agent_port).await?);
        }
        if nodes.is_empty() {
            nodes.push(format!("127.0.0.1:{DEFAULT_AGENT_PORT}"));
        }
        let token = match (&args.token, &args.token_file) {
            (Some(t), _) => Some(t.trim().to_owned()),
            (None, Some(f)) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| Error::io(format!("reading --token-file {}", f.display()), e))?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => match credentials::resolve(&args.api) {
                Ok(credentials::Credentials {
                    auth: credentials::Auth::Bearer { token, .. },
                    ..
                }) => Some(token),
                _ => None,
            },
        };
        Ok(Self {
            nodes,
            token: token.map(Arc::from),
            tls: Tls::new(args)?,
        })
    }

    /// The records of every node that match `filter`, merged in time order (at most its
    /// `last` of them all), and how many nodes could not be read (each named on stderr).
    pub async fn query(&self, filter: &Filter) -> (Vec<Flow>, usize) {
        let path = format!("/flows?{}", filter.to_query(false));
        let answers = futures::future::join_all(
            self.nodes
                .iter()
                .map(|n| get(n, &path, self.token.clone(), self.tls.as_ref())),
        )
        .await;
        let mut all = Vec::new();
        let mut failed = 0;
        for (node, a) in self.nodes.iter().zip(answers) {
            match a.and_then(|body| {
                serde_json::from_slice::<Vec<Flow>>(&body)
                    .map_err(|e| Error::datapath(format!("flows of {node}"), e.to_string()))
            }) {
                Ok(flows) => all.extend(flows),
                Err(e) => {
                    failed += 1;
                    eprintln!("cni-ebpf observe: {e}");
                }
            }
        }
        all.sort_by_key(|f| f.time_unix_nano);
        if let Some(n) = filter.last {
            all.drain(..all.len().saturating_sub(n));
        }
        (all, failed)
    }

    /// The records of every node that match `filter` as they come (with what `since` or
    /// `last` asks for first), in the order they arrive; and how many nodes answered.
    pub async fn follow(
        &self,
        filter: &Filter,
    ) -> (impl futures::Stream<Item = Flow> + Unpin, usize) {
        let q = filter.to_query(true);
        let mut streams = Vec::new();
        for node in &self.nodes {
            match stream(
                node,
                &format!("/flows?{q}"),
                self.token.clone(),
                self.tls.as_ref(),
            )
            .await
            {
                Ok(s) => streams.push(s),
                Err(e) => eprintln!("cni-ebpf observe: {e}"),
            }
        }
        let opened = streams.len();
        (select_all(streams), opened)
    }
}

/// Every Node's InternalIP (the first of each), with `port`.
async fn cluster_nodes(api: &ApiArgs, port: u16) -> Result<Vec<String>> {
    let client = ApiClient::new(api)
        .map_err(|e| Error::config("--all-nodes", e.to_string()))?
        .client();
    let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client)
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| Error::datapath("listing the Nodes", e.to_string()))?;
    Ok(nodes
        .items
        .iter()
        .filter_map(|n| {
            let a = n.status.as_ref()?.addresses.as_ref()?;
            let ip: std::net::IpAddr = a
                .iter()
                .find(|a| a.type_ == "InternalIP")?
                .address
                .parse()
                .ok()?;
            Some(SocketAddr::new(ip, port).to_string())
        })
        .collect())
}

/// The time allowed to connect to an agent and get its answer's head.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `GET path` to `node` (over `tls` when given); the response once its head is in.
async fn request(
    node: &str,
    path: &str,
    token: Option<Arc<str>>,
    tls: Option<&Tls>,
) -> Result<hyper::Response<hyper::body::Incoming>> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        Error::datapath(format!("{what} {node}"), e.to_string())
    };
    let go = async {
        let tcp = tokio::net::TcpStream::connect(node)
            .await
            .map_err(|e| fail("connecting to", &e))?;
        let mut send = match tls {
            Some(tls) => {
                let name = tls.name_of(node).map_err(|e| fail("naming", &e))?;
                let io = tls
                    .connector
                    .connect(name, tcp)
                    .await
                    .map_err(|e| fail("TLS with", &e))?;
                http1(io).await
            }
            None => http1(tcp).await,
        }
        .map_err(|e| fail("talking to", &e))?;
        let mut req = Request::get(path).header(hyper::header::HOST, node);
        if let Some(t) = &token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|e| fail("asking", &e))?;
        send.send_request(req).await.map_err(|e| fail("asking", &e))
    };
    let resp = tokio::time::timeout(CONNECT_TIMEOUT, go)
        .await
        .map_err(|_| fail("no answer in time from", &"timeout"))??;
    if resp.status() != StatusCode::OK {
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(Error::datapath(
            format!("reading flows of {node}"),
            format!("{status}: {}", String::from_utf8_lossy(&body).trim()),
        ));
    }
    Ok(resp)
}

/// An HTTP/1.1 client connection over `io`, driven on the runtime.
async fn http1<I>(io: I) -> hyper::Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(conn);
    Ok(send)
}

/// The whole body of `GET path` on `node`.
async fn get(node: &str, path: &str, token: Option<Arc<str>>, tls: Option<&Tls>) -> Result<Bytes> {
    let resp = request(node, path, token, tls).await?;
    let body = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect())
        .await
        .map_err(|_| Error::datapath(format!("reading flows of {node}"), "timeout"))?
        .map_err(|e| Error::datapath(format!("reading flows of {node}"), e.to_string()))?;
    Ok(body.to_bytes())
}

/// The records a follow of `path` on `node` streams, one per line (a `{"lost": n}` line
/// is told on stderr).
async fn stream(
    node: &str,
    path: &str,
    token: Option<Arc<str>>,
    tls: Option<&Tls>,
) -> Result<std::pin::Pin<Box<dyn futures::Stream<Item = Flow> + Send>>> {
    let resp = request(node, path, token, tls).await?;
    let node = node.to_owned();
    let body = resp.into_body().into_data_stream();
    let lines = futures::stream::unfold(
        (body, Vec::<u8>::new(), node),
        |(mut body, mut buf, node)| async move {
            loop {
                if let Some(i) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=i).collect();
                    match serde_json::from_slice::<Flow>(&line) {
                        Ok(f) => return Some((f, (body, buf, node))),
                        Err(_) => {
                            let text = String::from_utf8_lossy(&line);
                            eprintln!("cni-ebpf observe: {node}: {}", text.trim());
                            continue;
                        }
                    }
                }
                match body.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(e)) => {
                        eprintln!("cni-ebpf observe: {node}: {e}");
                        return None;
                    }
                    None => return None,
                }
            }
        },
    );
    Ok(Box::pin(lines))
}
