//! The kernel's IP stack: the `net` crate's `Stack` over the links that drivers register, polled from the progress loop with ib_core as the links' context.
//!
//! `lo` is there from boot (127.0.0.1/8). A driver registers its link with
//! [`register_link`] (IPoIB's `ib0` from its ib_client, mlx4_en's `eth0`):
//! it appears in `ip link` and takes the addresses the kernel command line
//! holds for it (`ip=ib0:10.0.0.1/24`, see the `net::config` module for
//! both forms). The progress loop calls [`poll`], which never waits: it
//! skips a pass while a console command holds the stack or the adapters,
//! so a node busy in a perftest run answers pings after it. Commands reach
//! the stack through [`with`] and [`with_stack`].
//!
//! IPoIB's links are registered here, from the progress loop: each
//! InfiniBand port the ipoib client took becomes `ib0`, `ib1`, ... once its
//! link has trained (a port without a cable waits for one), checked every
//! 100 ms until every port has its link ([`attach_ipoib`]). mlx4_en's too:
//! each Ethernet port of each adapter becomes `eth0`, `eth1`, ... (device
//! and port order) on the first pass after the adapters are up
//! ([`attach_en`]); its carrier follows the port's link.
//!
//! Leaves out: links that go away other than by [`unregister_link`], and
//! any use of the stack from a page fault (the page cache does not need it).

use alloc::boxed::Box;
use alloc::string::ToString;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ib_core::IbCore;
use net::{Link, LinkId, Stack};

/// The stack, with ib_core as what its links are polled with.
pub type NetStack = Stack<IbCore>;

static NET: spin::Mutex<Option<NetStack>> = spin::Mutex::new(None);

/// The stack's clock: microseconds since kernel entry.
pub fn now_us() -> u64 {
    crate::time::uptime_us()
}

/// Makes the stack with `lo`, and reads every `ip=` word of the command
/// line: an address for a link that exists is set at once, the others wait
/// for their link.
pub fn init(cmdline: &str) {
    let mut s = NetStack::new(now_us());
    for (_, v) in crate::cmdline::pairs(cmdline).filter(|(k, _)| *k == "ip") {
        match net::config::parse(v) {
            Ok(cs) => {
                for c in cs {
                    s.configure(c);
                }
            }
            Err(e) => log::warn!("{e}"),
        }
    }
    for c in s.pending() {
        log::info!(
            "{} for {} once it appears",
            c.addr,
            c.dev.as_deref().unwrap_or("the first link")
        );
    }
    *NET.lock() = Some(s);
}

/// Registers a driver's link as `name`; it takes its command-line
/// addresses and shows in `ip link`.
#[allow(dead_code)] // for other drivers (IPoIB's and mlx4_en's links come from `attach_*`)
pub fn register_link(name: &str, link: Box<dyn Link<IbCore>>) -> Result<LinkId, net::Error> {
    let mut g = NET.lock();
    let s = g.as_mut().ok_or(net::Error::Invalid("no IP stack"))?;
    let id = s.add_link(name, link)?;
    log::info!("{name}: registered with the IP stack as link {}", id.0);
    Ok(id)
}

/// Takes a link out of the stack (its driver is going away) and hands it
/// back.
#[allow(dead_code)] // for the drivers' removal paths
pub fn unregister_link(id: LinkId) -> Option<Box<dyn Link<IbCore>>> {
    NET.lock().as_mut()?.remove_link(id)
}

/// When [`attach_ipoib`] looks next (microseconds since kernel entry);
/// `u64::MAX` once every IPoIB port has its link.
static IPOIB_NEXT_US: AtomicU64 = AtomicU64::new(0);

/// How often [`attach_ipoib`] looks for ports that came up.
const IPOIB_CHECK_US: u64 = 100_000;

/// `ipoib_add_port`'s registration: every InfiniBand port whose link has
/// trained and has no link yet gets one (`ib0`, ...), registered with the
/// stack (it takes its `ip=` addresses). A port whose link cannot be made
/// is logged and left.
pub fn attach_ipoib(s: &mut NetStack, ib: &mut crate::hca::Ib) {
    attach_ipoib_ports(s, &mut ib.core, ib.ipoib);
}

/// [`attach_ipoib`] with ib_core and the IPoIB client given apart.
fn attach_ipoib_ports(s: &mut NetStack, core: &mut IbCore, ipoib_client: ib_core::ClientId) {
    let now = now_us();
    if now < IPOIB_NEXT_US.load(Ordering::Relaxed) {
        return;
    }
    IPOIB_NEXT_US.store(now + IPOIB_CHECK_US, Ordering::Relaxed);
    for p in ipoib::ports_ready(core, ipoib_client) {
        let dev = core.device(p.dev).map_or("?", |d| d.name()).to_string();
        match ipoib::IpoibDev::open(core, ipoib_client, &p, ipoib::Config::default()) {
            Ok(link) => match s.add_link(&p.name, Box::new(link)) {
                Ok(id) => log::info!(
                    "{}: {dev} port {}: registered with the IP stack as link {}",
                    p.name,
                    p.port,
                    id.0
                ),
                Err(e) => log::error!("{}: cannot register the link: {e}", p.name),
            },
            Err(e) => log::error!("{}: {dev} port {}: no IPoIB link: {e}", p.name, p.port),
        }
    }
    if ipoib::ports(core, ipoib_client).iter().all(|p| p.opened) {
        IPOIB_NEXT_US.store(u64::MAX, Ordering::Relaxed);
    }
}

/// Whether [`attach_en`] has looked at the adapters.
static EN_DONE: AtomicBool = AtomicBool::new(false);

/// How an mlx4_en link finds its `Dev` (and `ethtool -S` too): the mlx4_ib
/// device ib_core holds under the link's handle (the `DeviceId`).
pub fn en_dev(core: &mut IbCore, handle: u32) -> Option<&mut mlx4_core::Dev> {
    core.device_mut(ib_core::device::DeviceId(handle))?
        .provider_as::<mlx4_ib::Mlx4IbDev>()
        .map(|m| m.core_mut())
}

/// `mlx4_en_add` for every adapter: each Ethernet port gets its link
/// (`eth0`, ... in device and port order), registered with the stack (it
/// takes its `ip=` addresses). A port that cannot be opened is logged and
/// left.
pub fn attach_en(s: &mut NetStack, ib: &mut crate::hca::Ib) {
    if EN_DONE.swap(true, Ordering::Relaxed) {
        return;
    }
    let mut n = 0;
    for h in ib.hcas.iter() {
        let Some(id) = h.id else { continue };
        let Some(dev) = en_dev(&mut ib.core, id.0) else {
            continue;
        };
        for port in dev.protocol_ports(mlx4_core::Protocol::En) {
            let name = alloc::format!("eth{n}");
            n += 1;
            match mlx4_en::EnPriv::open(dev, port, &name, id.0, mlx4_en::EnConfig::default()) {
                Ok(en) => {
                    let link = mlx4_en::EnLink::<IbCore>::new(en, en_dev);
                    match s.add_link(&name, Box::new(link)) {
                        Ok(lid) => {
                            log::info!(
                                "{name}: {} port {port}: registered with the IP stack as link {}",
                                h.name,
                                lid.0
                            );
                        }
                        Err(e) => log::error!("{name}: cannot register the link: {e}"),
                    }
                }
                Err(e) => log::error!("{name}: {} port {port}: no mlx4_en link: {e}", h.name),
            }
        }
    }
}

/// An interface over an Ethernet port: mlx4_en's link of the port or one
/// of its VLAN devices.
pub struct EnNetdev {
    /// The mlx4_ib device (ib_core's id) and port it runs on.
    pub dev: ib_core::DeviceId,
    /// The port.
    pub port: u8,
    /// The VLAN id of a VLAN device.
    pub vlan: Option<u16>,
    /// `eth0`, `eth0.5`.
    pub name: alloc::string::String,
    /// Its IPv4 addresses.
    pub addrs: alloc::vec::Vec<[u8; 4]>,
}

/// The interfaces over Ethernet ports, in link order (what `show_gids`
/// names a RoCE GID's interface by, as Linux's `gid_attrs/ndevs`).
pub fn en_netdevs() -> alloc::vec::Vec<EnNetdev> {
    with_stack(|s| {
        s.links()
            .filter_map(|(id, name)| {
                let r = s.roce_link(id)?;
                Some(EnNetdev {
                    dev: ib_core::DeviceId(r.dev),
                    port: r.port,
                    vlan: r.vlan,
                    name: name.to_string(),
                    addrs: s.addrs(id).iter().map(|c| c.address().octets()).collect(),
                })
            })
            .collect()
    })
    .unwrap_or_default()
}

/// One pass of the stack (receive, echo services, send), if neither the
/// stack nor the adapters are held (never blocks); IPoIB ports that came
/// up get their links first.
pub fn poll() {
    let Some(mut g) = NET.try_lock() else {
        return;
    };
    let Some(s) = g.as_mut() else {
        return;
    };
    let _ = crate::hca::try_with(|ib| {
        attach_en(s, ib);
        attach_ipoib(s, ib);
        let busy = s.poll(now_us(), &mut ib.core);
        // The RDMA CM's turn with the stack, once someone uses it (RoCE
        // ports hear of addresses and neighbours in any case).
        match ib.core.client_by_name("rdma_cm") {
            Some(cma) => {
                rdma_cm_poll(s, &mut ib.core, cma);
            }
            None => roce_sync(s, &mut ib.core),
        }
        busy
    });
}

/// mlx4_ib's view of each Ethernet link with a RoCE port behind it (Linux:
/// `roce_gid_mgmt` on an address change, the neighbour table): its IPv4
/// addresses become the port's IPv4-mapped GIDs, the MACs ARP found the
/// destination MACs of those peers' GIDs.
pub fn roce_sync(s: &NetStack, core: &mut IbCore) {
    static ROCE_SYNC_WARNED: AtomicBool = AtomicBool::new(false);
    // This runs on every pass of the stack: the addresses and neighbours
    // are gathered into buffers kept between passes (no allocation once
    // they have grown to the links' sizes).
    type Scratch = (
        alloc::vec::Vec<[u8; 4]>,
        alloc::vec::Vec<([u8; 4], [u8; 6])>,
    );
    static SCRATCH: spin::Mutex<Scratch> =
        spin::Mutex::new((alloc::vec::Vec::new(), alloc::vec::Vec::new()));
    let mut scratch = SCRATCH.lock();
    let (addrs, neigh) = &mut *scratch;
    for (id, _) in s.links() {
        let Some(r) = s.roce_link(id) else {
            continue;
        };
        s.roce_addrs(id, addrs, neigh);
        if let Some(m) = core
            .device_mut(ib_core::device::DeviceId(r.dev))
            .and_then(|d| d.provider_as::<mlx4_ib::Mlx4IbDev>())
            && let Err(e) = m.sync_roce_netdev(r.port, r.vlan, addrs, neigh)
            && !ROCE_SYNC_WARNED.swap(true, Ordering::Relaxed)
        {
            log::warn!(
                "RoCE port {}: its GIDs and neighbours not updated: {e}",
                r.port
            );
        }
    }
}

/// The stack's clock for [`ipoib::rdma_net::StackNet`].
fn stack_now(_: &IbCore) -> u64 {
    now_us()
}

/// `ib_core::cma::net_poll` with this stack: address requests waiting for
/// ARP move, the RDMA CM sees the devices' addresses.
pub fn rdma_cm_poll(s: &mut NetStack, core: &mut IbCore, cma: ib_core::ClientId) -> usize {
    roce_sync(s, core);
    let mut n = ipoib::rdma_net::StackNet::new(s, &stack_now);
    ib_core::cma::net_poll(core, cma, &mut n)
}

/// Runs `f` with the stack as the RDMA CM's IP side
/// ([`ipoib::rdma_net::StackNet`]), and ib_core.
pub fn with_rdma_net<R>(
    f: impl FnOnce(&mut ipoib::rdma_net::StackNet<'_>, &mut IbCore) -> R,
) -> Option<R> {
    with(|s, core| {
        let mut n = ipoib::rdma_net::StackNet::new(s, &stack_now);
        f(&mut n, core)
    })
}

/// The stack lent to the RDMA CM by a console command that holds it and
/// the adapters for long (`rmem serve`, connecting to memory nodes by IP
/// address): the progress loop cannot poll them meanwhile, so each of the
/// command's own polls ([`IpNet::poll`]) does what the loop would, IPoIB
/// links of ports that came up included (a memory node that serves from
/// boot, before its port trained, still gets its `ib0` and answers ARP).
pub struct CommandNet<'a> {
    net: ipoib::rdma_net::StackNet<'a>,
    ipoib: ib_core::ClientId,
}

impl CommandNet<'_> {
    /// The stack itself (its sockets).
    pub fn stack(&mut self) -> &mut NetStack {
        self.net.stack
    }
}

impl ib_core::addr::IpNet for CommandNet<'_> {
    fn route(
        &mut self,
        src: Option<core::net::Ipv4Addr>,
        dst: core::net::Ipv4Addr,
    ) -> ib_core::Result<ib_core::addr::IpRoute> {
        self.net.route(src, dst)
    }
    fn netdevs(&self, f: &mut dyn FnMut(&ib_core::addr::NetDev)) {
        self.net.netdevs(f);
    }
    fn neigh(
        &mut self,
        core: &mut IbCore,
        ifindex: u32,
        ip: core::net::Ipv4Addr,
        start: bool,
    ) -> ib_core::Result<Option<ib_core::addr::DevAddrBytes>> {
        self.net.neigh(core, ifindex, ip, start)
    }
    fn poll(&mut self, core: &mut IbCore) {
        attach_ipoib_ports(self.net.stack, core, self.ipoib);
        self.net.poll(core);
        roce_sync(self.net.stack, core);
    }
}

/// Runs `f` with the stack lent as a [`CommandNet`] and the adapters (NET,
/// then the adapters: the order of [`with`]); `None` before [`init`] or
/// without an adapter.
pub fn with_command_net<R>(
    f: impl FnOnce(&mut CommandNet<'_>, &mut crate::hca::Ib) -> R,
) -> Option<R> {
    let mut g = NET.lock();
    let s = g.as_mut()?;
    crate::hca::with(|ib| {
        let mut n = CommandNet {
            net: ipoib::rdma_net::StackNet::new(s, &stack_now),
            ipoib: ib.ipoib,
        };
        f(&mut n, ib)
    })
}

/// Runs `f` on the stack and ib_core; `None` before [`init`].
pub fn with<R>(f: impl FnOnce(&mut NetStack, &mut IbCore) -> R) -> Option<R> {
    let mut g = NET.lock();
    let s = g.as_mut()?;
    crate::hca::with(|ib| f(s, &mut ib.core))
}

/// Runs `f` on the stack alone (configuration, `ip`); `None` before
/// [`init`].
pub fn with_stack<R>(f: impl FnOnce(&mut NetStack) -> R) -> Option<R> {
    NET.lock().as_mut().map(f)
}
