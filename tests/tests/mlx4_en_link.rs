//! mlx4_en against the model: two driver-run HCAs whose ports 1 are on the
//! fabric's Ethernet switch (`--nodes 2 --link-layer eth`), each port an
//! Ethernet link of its own IP stack. ARP and ping between them; frames the
//! card must drop (a giant, a VLAN the port is not in, a runt sent) are
//! counted by the port and nothing stalls.

use std::sync::{Arc, Mutex};

use mlx4_core::{Dev, Profile};
use mlx4_en::{EnConfig, EnLink, EnPriv, EnShared};
use net::{Ipv4Cidr, LinkId, Stack};
use sim::fabric::{LinkLayer, Topology};
use sim::{SimConfig, Wire};
use tests::mlx4_common::{Model, bring_up};

/// What the stack polls the link with: the device.
struct Ctx {
    dev: Dev,
}

fn get_dev(c: &mut Ctx, _handle: u32) -> Option<&mut Dev> {
    Some(&mut c.dev)
}

struct Node {
    ctx: Ctx,
    stack: Stack<Ctx>,
    link: LinkId,
    hca: Model,
}

impl Node {
    fn now(&self) -> u64 {
        self.hca.clock().now_ns() / 1000
    }

    fn step(&mut self) {
        self.ctx.dev.poll();
        let now = self.now();
        self.stack.poll(now, &mut self.ctx);
    }

    fn en(&mut self) -> EnShared {
        en_of(&mut self.stack, self.link)
    }

    fn ethtool(&mut self) -> Vec<(String, u64)> {
        en_of(&mut self.stack, self.link)
            .lock()
            .ethtool_stats(&mut self.ctx.dev)
    }

    fn stat(&mut self, name: &str) -> u64 {
        self.ethtool()
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no counter {name}"))
            .1
    }

    /// Sends `frame` as is on the port's send ring.
    fn raw_send(&mut self, frame: &[u8]) -> bool {
        en_of(&mut self.stack, self.link)
            .lock()
            .xmit(&self.ctx.dev, frame)
    }

    fn finish(mut self) {
        en_of(&mut self.stack, self.link)
            .lock()
            .close(&mut self.ctx.dev);
        let _ = self.stack.remove_link(self.link);
        let Node { ctx, hca, .. } = self;
        ctx.dev.teardown();
        hca.finish();
    }
}

fn en_of(stack: &mut Stack<Ctx>, link: LinkId) -> EnShared {
    stack
        .link_mut(link)
        .and_then(|l| l.as_any_mut())
        .and_then(|a| a.downcast_mut::<EnShared>())
        .expect("an mlx4_en link")
        .clone()
}

struct Net {
    a: Node,
    b: Node,
    wire: Wire,
    fabric: Arc<Mutex<sim::fabric::Fabric>>,
    /// Node A's port 1 on the fabric.
    a_port: sim::fabric::PortId,
}

impl Net {
    /// `--nodes 2 --link-layer eth`: ports 1 on the Ethernet switch, the
    /// cards' ports `auto` (sensed Ethernet), mlx4_en on port 1 of each
    /// with `cfg_a`/`cfg_b`, 10.0.0.1 and 10.0.0.2.
    fn new(cfg_a: EnConfig, cfg_b: EnConfig) -> Net {
        let mut f = sim::fabric::Fabric::new();
        let built = Topology::for_nodes_with(2, [LinkLayer::Eth, LinkLayer::Ib])
            .unwrap()
            .build(&mut f)
            .unwrap();
        let a_port = built.hcas[0].ports[0];
        let fabric = Arc::new(Mutex::new(f));
        let wire = Wire::over(fabric.clone(), SimConfig::default().relax_step);
        let mut nodes = built
            .hcas
            .iter()
            .zip([cfg_a, cfg_b])
            .enumerate()
            .map(|(i, (h, cfg))| {
                let hca = Model::on_ports(
                    SimConfig {
                        node_guid: h.node_guid,
                        port_types: [sim::PortType::Auto; 2],
                        ..SimConfig::default()
                    },
                    &wire,
                    [Some(h.ports[0]), Some(h.ports[1])],
                );
                let mut dev = bring_up(&hca, Profile::default()).unwrap();
                assert_eq!(dev.protocol_ports(mlx4_core::Protocol::En), vec![1]);
                let name = "eth0";
                let en = EnPriv::open(&mut dev, 1, name, 0, cfg)
                    .unwrap_or_else(|e| panic!("{e}: {:?}", hca.violations()));
                let mut stack = Stack::new(hca.clock().now_ns() / 1000);
                let link = stack
                    .add_link(name, Box::new(EnLink::<Ctx>::new(en, get_dev)))
                    .unwrap();
                let addr = format!("10.0.0.{}", i + 1);
                stack
                    .add_addr(link, Ipv4Cidr::new(addr.parse().unwrap(), 24))
                    .unwrap();
                Node {
                    ctx: Ctx { dev },
                    stack,
                    link,
                    hca,
                }
            });
        let a = nodes.next().unwrap();
        let b = nodes.next().unwrap();
        let mut n = Net {
            a,
            b,
            wire,
            fabric,
            a_port,
        };
        n.until(2000, |n| {
            n.a.stack.carrier(n.a.link) && n.b.stack.carrier(n.b.link)
        });
        n
    }

    fn round(&mut self) {
        self.a.step();
        self.b.step();
        self.wire.settle();
        self.a.hca.clock().relax();
    }

    /// Rounds until `done` or `max` rounds; whether it came.
    fn until(&mut self, max: usize, mut done: impl FnMut(&mut Net) -> bool) -> bool {
        for _ in 0..max {
            if done(self) {
                return true;
            }
            self.round();
        }
        done(self)
    }

    /// `ping` from a to `dst` with `args`: the replies and the output.
    fn ping(&mut self, args: &[&str]) -> (u64, String) {
        let o = net::ping::parse(args).unwrap();
        let mut out = String::new();
        let now = self.a.now();
        let mut p = net::ping::Ping::start(&mut self.a.stack, o, now, &mut out).unwrap();
        for _ in 0..200_000 {
            self.round();
            let now = self.a.now();
            if !p.step(&mut self.a.stack, now, &mut out) {
                break;
            }
        }
        let n = p.received_count();
        p.finish(&mut self.a.stack, &mut out);
        (n, out)
    }

    fn finish(self) {
        self.a.finish();
        self.b.finish();
    }
}

fn frame(dst: [u8; 6], src: [u8; 6], ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ty.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

#[test]
fn two_ports_on_the_ethernet_switch_resolve_each_other_and_answer_ping() {
    let mut n = Net::new(EnConfig::default(), EnConfig::default());
    assert_eq!(
        n.a.stack.link(n.a.link).unwrap().hw_addr().as_bytes().len(),
        6
    );
    let (got, out) = n.ping(&["-c", "3", "-i", "0.01", "10.0.0.2"]);
    assert_eq!(got, 3, "{out}");
    assert!(out.contains("3 packets transmitted, 3 received"), "{out}");
    // ARP went both ways: each side holds the other's MAC.
    let b_mac = mlx4_en::mac_bytes(n.b.en().lock().mac);
    let mut seen = None;
    n.a.stack.neighbours(n.a.link, &mut |e| {
        if e.addr == "10.0.0.2".parse::<net::Ipv4Address>().unwrap() {
            seen = e.lladdr;
        }
    });
    assert_eq!(seen.map(|m| m.as_bytes().to_vec()), Some(b_mac.to_vec()));
    // The rings and the port counted the traffic; the ARP request was a
    // broadcast B's port received.
    assert!(n.a.stat("tx0_packets") >= 4, "{:?}", n.a.ethtool());
    assert!(n.b.stat("rx0_packets") >= 4);
    assert!(n.b.stat("rx_broadcast_phy") >= 1, "{:?}", n.b.ethtool());
    assert!(n.b.stat("rx_packets_phy") >= 4);
    assert_eq!(n.b.stat("rx_dropped"), 0);
    let s = n.a.stack.stats(n.a.link).unwrap();
    assert!(s.tx_packets >= 4 && s.rx_packets >= 4, "{s:?}");
    n.finish();
}

#[test]
fn frames_the_port_must_refuse_are_counted_and_nothing_stalls() {
    // A's port takes frames up to 1900 bytes of IP; B's stays at 1500.
    let big = EnConfig {
        mtu: 1900,
        ..EnConfig::default()
    };
    let mut n = Net::new(big, EnConfig::default());
    let (got, out) = n.ping(&["-c", "1", "10.0.0.2"]);
    assert_eq!(got, 1, "{out}");
    // A giant for B: 1700 bytes of ping is a 1742-byte frame, beyond B's
    // 1522 (with tag and FCS).
    let (got, out) = n.ping(&[
        "-c", "2", "-i", "0.01", "-W", "0.05", "-s", "1700", "10.0.0.2",
    ]);
    assert_eq!(got, 0, "{out}");
    assert_eq!(n.b.stat("rx_too_long_phy"), 2, "{:?}", n.b.ethtool());
    // A frame tagged with VLAN 5, which B's port is not in.
    let (a_mac, b_mac) = (
        mlx4_en::mac_bytes(n.a.en().lock().mac),
        mlx4_en::mac_bytes(n.b.en().lock().mac),
    );
    let mut tagged = frame(b_mac, a_mac, 0x8100, &[0x00, 0x05, 0x08, 0x00]);
    tagged.extend_from_slice(&[0u8; 60]);
    let dropped = n.b.stat("rx_dropped_phy");
    assert!(n.a.raw_send(&tagged));
    // A runt sent: shorter than an Ethernet header, the card drops it on
    // the way out and completes its descriptor.
    n.a.hca.expect_violation("shorter than an Ethernet header");
    assert!(n.a.raw_send(&[0u8; 8]));
    assert!(n.until(2000, |n| n.b.stat("rx_dropped_phy") > dropped));
    assert!(
        n.until(2000, |n| n.a.stat("tx_dropped_phy") == 1),
        "{:?}",
        n.a.ethtool()
    );
    assert_eq!(n.b.stat("rx0_errors") + n.b.stat("rx0_dropped"), 0);
    // Ping still works both ways.
    let (got, out) = n.ping(&["-c", "2", "-i", "0.01", "10.0.0.2"]);
    assert_eq!(got, 2, "{out}");
    n.finish();
}

#[test]
fn the_carrier_follows_the_cable() {
    let mut n = Net::new(EnConfig::default(), EnConfig::default());
    let (got, out) = n.ping(&["-c", "1", "10.0.0.2"]);
    assert_eq!(got, 1, "{out}");
    let peer = n
        .fabric
        .lock()
        .unwrap()
        .peer(n.a_port)
        .expect("A is cabled");
    n.fabric.lock().unwrap().unplug(n.a_port).unwrap();
    assert!(
        n.until(4000, |n| !n.a.stack.carrier(n.a.link)),
        "A's port saw its cable go"
    );
    // B's cable to the switch is still there.
    assert!(n.b.stack.carrier(n.b.link));
    // No carrier: ping sends nothing and gets nothing.
    let (got, _) = n.ping(&["-c", "1", "-W", "0.05", "10.0.0.2"]);
    assert_eq!(got, 0);
    n.fabric.lock().unwrap().connect(n.a_port, peer).unwrap();
    assert!(
        n.until(4000, |n| n.a.stack.carrier(n.a.link)),
        "the link came back"
    );
    let (got, out) = n.ping(&["-c", "2", "-i", "0.01", "10.0.0.2"]);
    assert_eq!(got, 2, "{out}");
    n.finish();
}
