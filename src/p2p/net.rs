//! The connection manager: listener with caps and eviction, outbound
//! dialing (connect, addnode, address book), DNS seeding. The state it
//! shares with the peer tasks is `super::state`.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, info_span, warn, Instrument};

use super::misbehaviour::Disconnect;
use super::peer;
use super::state::{Net, PeerCmd};
use super::sync::PeerId;
use super::{NetCommand, NodeBackend, P2pConfig, P2pControl, P2pError};

/// Minimum time between two rounds of DNS seeding.
const SEED_INTERVAL: Duration = Duration::from_secs(300);
/// Back-off of manual peers (`connect`, `addnode`) after a failure.
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What became of an outbound dial.
enum DialEvent {
    Connected,
    Failed,
    /// The session ended after this long.
    Ended(Duration),
}

/// Transactions kept for `getdata` after a relay.
const RECENT_TXS: usize = 100;

/// Runs the P2P layer until `shutdown` becomes `true` (or its sender is
/// dropped): listener, dialing, one task per peer. Peer tasks end with it;
/// the address book is saved on the way out.
///
/// # Errors
/// [`P2pError::Bind`] when the listen address cannot be bound. Nothing a
/// peer does ends `run`.
pub async fn run(
    backend: Arc<dyn NodeBackend>,
    config: P2pConfig,
    control: P2pControl,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), P2pError> {
    let P2pControl { mut cmd_rx, shared } = control;
    let listener = bind_listener(config.listen, &shared).await?;
    let net = Arc::new(Net::new(backend, config, shared)?);
    let mut tasks = JoinSet::new();
    let mut connecting: HashSet<SocketAddr> = HashSet::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(SocketAddr, DialEvent)>();
    let mut retry: HashMap<SocketAddr, (Instant, Duration)> = HashMap::new();
    let mut tick = tokio::time::interval(net.config.timeouts.maintenance);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_save = Instant::now();
    let mut last_seed: Option<Instant> = None;
    let mut accept_log = crate::fds::LogThrottle::new(Duration::from_secs(10));
    loop {
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            accepted = accept(&listener) => {
                match accepted {
                    Ok((stream, addr)) => on_inbound(&net, &mut tasks, &shutdown, stream, addr),
                    Err(e) => {
                        // Out of descriptors is back-pressure: pause, and
                        // log once per period, not at every retry.
                        if let Some(missed) = accept_log.hit() {
                            warn!(error = %e, missed, "accept failed: pausing accepts");
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            Some((addr, event)) = done_rx.recv() => {
                on_dial_event(&net, &mut connecting, &mut retry, addr, event);
            }
            cmd = cmd_rx.recv() => {
                if let Some(cmd) = cmd {
                    on_command(&net, cmd);
                }
            }
            _ = tick.tick() => {
                maintain_outbound(&net, &mut tasks, &shutdown, &mut connecting, &mut retry, &done_tx);
                maybe_seed(&net, &mut tasks, &mut last_seed);
                if last_save.elapsed() > net.config.timeouts.addr_book_save {
                    last_save = Instant::now();
                    save_book(&net).await;
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            changed = shutdown.changed() => {
                if changed.is_err() {
                    // The sender is gone: nobody can stop us any more, stop now.
                    break;
                }
            }
        }
    }
    info!("p2p shutting down");
    net.broadcast(|| PeerCmd::Shutdown);
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .is_err()
    {
        tasks.abort_all();
    }
    save_book(&net).await;
    Ok(())
}

/// Binds the listen address, if any, and publishes the bound address
/// (port 0 becomes the port the system gave).
///
/// # Errors
/// [`P2pError::Bind`] when the address cannot be bound.
async fn bind_listener(
    listen: Option<SocketAddr>,
    shared: &super::HandleShared,
) -> Result<Option<TcpListener>, P2pError> {
    let Some(addr) = listen else {
        return Ok(None);
    };
    let l = TcpListener::bind(addr)
        .await
        .map_err(|source| P2pError::Bind { addr, source })?;
    let local = l
        .local_addr()
        .map_err(|source| P2pError::Bind { addr, source })?;
    info!(%local, "p2p listening");
    shared.local_addr.send_replace(Some(local));
    Ok(Some(l))
}

/// The end of a dial or of an outbound session to `addr`: it is no longer
/// connecting, and a manual peer (`connect`, `addnode`) gets its next try
/// after a backoff that doubles (up to `MAX_BACKOFF`) while sessions fail
/// or end within 10 s, and resets after a longer one.
fn on_dial_event(
    net: &Net,
    connecting: &mut HashSet<SocketAddr>,
    retry: &mut HashMap<SocketAddr, (Instant, Duration)>,
    addr: SocketAddr,
    event: DialEvent,
) {
    let manual = net.config.connect.contains(&addr) || net.config.addnode.contains(&addr);
    let grown = retry
        .get(&addr)
        .map(|(_, d)| (*d * 2).min(MAX_BACKOFF))
        .unwrap_or(MIN_BACKOFF);
    let backoff = match event {
        DialEvent::Connected => {
            connecting.remove(&addr);
            None
        }
        DialEvent::Failed => {
            connecting.remove(&addr);
            Some(grown)
        }
        // A session that ended quickly (the peer refuses us, or we it)
        // backs off like a failure; a long one resets.
        DialEvent::Ended(lasted) if lasted < Duration::from_secs(10) => Some(grown),
        DialEvent::Ended(_) => Some(MIN_BACKOFF),
    };
    if let (true, Some(b)) = (manual, backoff) {
        retry.insert(addr, (Instant::now() + b, b));
    }
}

/// A command from the node: announce the new tip to every peer, or relay a
/// transaction (kept for `getdata`, the last [`RECENT_TXS`]).
fn on_command(net: &Net, cmd: NetCommand) {
    match cmd {
        NetCommand::AnnounceTip => net.broadcast(|| PeerCmd::AnnounceTip),
        NetCommand::RelayTx(tx) => {
            {
                let mut recent = net.recent_txs.lock();
                recent.push_back(tx.clone());
                while recent.len() > RECENT_TXS {
                    recent.pop_front();
                }
            }
            net.broadcast(|| PeerCmd::RelayTx(tx.clone()));
        }
    }
}

/// Asks the network's DNS seeds for addresses at start, and again every
/// `SEED_INTERVAL` while the book stays small (under 100 entries: all its
/// entries may have failed and gone); never with `connect` set.
fn maybe_seed(net: &Arc<Net>, tasks: &mut JoinSet<()>, last_seed: &mut Option<Instant>) {
    if net.config.connect.is_empty()
        && net.config.dns_seeds
        && !net.backend.params().dns_seeds.is_empty()
        && last_seed.is_none_or(|t: Instant| t.elapsed() > SEED_INTERVAL)
        && net.addrs.lock().len() < 100
    {
        *last_seed = Some(Instant::now());
        let n = net.clone();
        tasks.spawn(async move { seed_from_dns(n).await });
    }
}

async fn accept(l: &Option<TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match l {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

async fn save_book(net: &Arc<Net>) {
    let Some(path) = net.config.addr_file.clone() else {
        return;
    };
    let n = net.clone();
    let res = tokio::task::spawn_blocking(move || n.addrs.lock().save(&path)).await;
    match res {
        Ok(Ok(())) => {}
        // Not consensus data: the node goes on with the book in memory and
        // tries again at the next save.
        Ok(Err(e)) => warn!(error = %e, "saving the address book failed; going on"),
        Err(e) => warn!(error = %e, "address book save task failed"),
    }
}

fn on_inbound(
    net: &Arc<Net>,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
    stream: TcpStream,
    addr: SocketAddr,
) {
    let ip = addr.ip();
    let (inbound, outbound) = net.counts();
    // Core's discouragement (net.cpp `CreateNodeFromAcceptedSocket`): a
    // discouraged address gets an inbound slot only if it would not take
    // the last one.
    if net.is_banned(ip) && inbound + 1 >= net.config.max_inbound {
        debug!(peer = %addr, "refusing discouraged address");
        return;
    }
    let same_ip = net
        .peers
        .lock()
        .values()
        .filter(|e| e.addr.ip() == ip)
        .count();
    if same_ip >= net.config.per_ip_limit {
        debug!(peer = %addr, same_ip, "refusing inbound: per-IP limit");
        return;
    }
    if inbound >= net.config.max_inbound || inbound + outbound >= net.config.max_total {
        match select_eviction(net) {
            Some(victim) => {
                debug!(peer = %addr, victim, "inbound slots full: evicting a peer");
                net.send_to(victim, PeerCmd::Disconnect(Disconnect::Evicted));
            }
            None => {
                debug!(peer = %addr, inbound, "refusing inbound: slots full, all protected");
                return;
            }
        }
    }
    let (id, rx) = net.register(addr, true, false);
    let n = net.clone();
    let sd = shutdown.clone();
    tasks.spawn(async move {
        peer::run_peer(n, stream, addr, id, true, rx, sd)
            .instrument(info_span!("peer", peer = %addr, id))
            .await;
    });
}

fn maintain_outbound(
    net: &Arc<Net>,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
    connecting: &mut HashSet<SocketAddr>,
    retry: &mut HashMap<SocketAddr, (Instant, Duration)>,
    done_tx: &mpsc::UnboundedSender<(SocketAddr, DialEvent)>,
) {
    let connected: HashSet<SocketAddr> = net.peers.lock().values().map(|e| e.addr).collect();
    let now = Instant::now();
    let manual: Vec<SocketAddr> = net
        .config
        .connect
        .iter()
        .chain(net.config.addnode.iter())
        .copied()
        .collect();
    for addr in manual {
        if connected.contains(&addr) || connecting.contains(&addr) {
            continue;
        }
        if matches!(retry.get(&addr), Some((at, _)) if *at > now) {
            continue;
        }
        dial(net, tasks, shutdown, connecting, done_tx, addr, true);
    }
    if !net.config.connect.is_empty() {
        return;
    }
    let (inbound, _) = net.counts();
    let auto_out = net
        .peers
        .lock()
        .values()
        .filter(|e| !e.inbound && !e.manual)
        .count();
    let pending = connecting.len();
    if auto_out + pending >= net.config.max_outbound_full_relay
        || inbound + auto_out + pending >= net.config.max_total
    {
        return;
    }
    let mut exclude = connected;
    exclude.extend(connecting.iter().copied());
    let pick = {
        let mut bans = net.bans();
        bans.purge_expired();
        net.addrs.lock().select(&exclude, |ip| bans.is_banned(ip))
    };
    if let Some(addr) = pick {
        dial(net, tasks, shutdown, connecting, done_tx, addr, false);
    }
}

fn dial(
    net: &Arc<Net>,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
    connecting: &mut HashSet<SocketAddr>,
    done_tx: &mpsc::UnboundedSender<(SocketAddr, DialEvent)>,
    addr: SocketAddr,
    manual: bool,
) {
    connecting.insert(addr);
    let n = net.clone();
    let sd = shutdown.clone();
    let done = done_tx.clone();
    tasks.spawn(async move {
        let conn = tokio::time::timeout(n.config.timeouts.connect, TcpStream::connect(addr)).await;
        match conn {
            Ok(Ok(stream)) => {
                let (id, rx) = n.register(addr, false, manual);
                let _ = done.send((addr, DialEvent::Connected));
                let started = Instant::now();
                peer::run_peer(n, stream, addr, id, false, rx, sd)
                    .instrument(info_span!("peer", peer = %addr, id))
                    .await;
                let _ = done.send((addr, DialEvent::Ended(started.elapsed())));
            }
            _ => {
                debug!(peer = %addr, "connect failed");
                n.addrs.lock().mark_failed(addr);
                let _ = done.send((addr, DialEvent::Failed));
            }
        }
    });
}

async fn seed_from_dns(net: Arc<Net>) {
    let port = net.backend.params().p2p_port;
    for seed in net.backend.params().dns_seeds {
        let lookup = tokio::net::lookup_host((*seed, port));
        match tokio::time::timeout(Duration::from_secs(10), lookup).await {
            Ok(Ok(addrs)) => {
                let mut book = net.addrs.lock();
                let mut n = 0;
                for a in addrs.take(256) {
                    // NODE_NETWORK | NODE_WITNESS: what seeds filter for.
                    book.add(a, 1 | 8, None);
                    n += 1;
                }
                info!(seed, addresses = n, "dns seed answered");
            }
            Ok(Err(e)) => debug!(seed, error = %e, "dns seed failed"),
            Err(_) => debug!(seed, "dns seed timed out"),
        }
    }
}

/// Network group of an address for eviction: IPv4 /16, IPv6 /32
/// (IPv4-mapped IPv6 as IPv4), as Core's `NetGroupManager` without ASmap.
fn netgroup(ip: IpAddr) -> Vec<u8> {
    let ip = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => vec![4, v4.octets()[0], v4.octets()[1]],
        IpAddr::V6(v6) => {
            let o = v6.octets();
            vec![6, o[0], o[1], o[2], o[3]]
        }
    }
}

/// Picks an inbound peer to evict for a new inbound connection, or
/// `None` when every candidate is protected. Core's
/// `SelectNodeToEvict` (net.cpp), simplified: protect the 8 lowest
/// pings, the 4 most recent block providers, then the older half by
/// uptime; prefer discouraged peers; evict the youngest peer of the
/// network group (IPv4 /16, IPv6 /32) with the most connections.
fn select_eviction(net: &Net) -> Option<PeerId> {
    struct Cand {
        id: PeerId,
        group: Vec<u8>,
        connected_at: Instant,
        min_ping: Option<Duration>,
        last_block: Option<Instant>,
        discouraged: bool,
    }
    let mut c: Vec<Cand> = {
        let bans = net.bans();
        net.peers
            .lock()
            .iter()
            .filter(|(_, e)| e.inbound && !e.manual)
            .map(|(id, e)| Cand {
                id: *id,
                group: netgroup(e.addr.ip()),
                connected_at: e.connected_at,
                min_ping: e.min_ping,
                last_block: e.last_block,
                discouraged: bans.is_banned(e.addr.ip()),
            })
            .collect()
    };
    // 8 lowest pings (peers never measured sort last and are not
    // protected by this rule).
    c.sort_by_key(|x| x.min_ping.unwrap_or(Duration::MAX));
    let protect = c.iter().take(8).filter(|x| x.min_ping.is_some()).count();
    c.drain(..protect);
    // 4 most recent block providers.
    c.sort_by_key(|x| std::cmp::Reverse(x.last_block));
    let protect = c.iter().take(4).filter(|x| x.last_block.is_some()).count();
    c.drain(..protect);
    // The older half by uptime.
    c.sort_by_key(|x| x.connected_at);
    let protect = c.len() / 2;
    c.drain(..protect);
    if c.is_empty() {
        return None;
    }
    if c.iter().any(|x| x.discouraged) {
        c.retain(|x| x.discouraged);
    }
    let mut groups: HashMap<Vec<u8>, Vec<&Cand>> = HashMap::new();
    for x in &c {
        groups.entry(x.group.clone()).or_default().push(x);
    }
    // Largest group; ties go to the group with the youngest member.
    let youngest = |g: &Vec<&Cand>| g.iter().map(|x| x.connected_at).max();
    let group = groups
        .values()
        .max_by(|a, b| a.len().cmp(&b.len()).then(youngest(a).cmp(&youngest(b))))?;
    group.iter().max_by_key(|x| x.connected_at).map(|x| x.id)
}
