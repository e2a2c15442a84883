//! infiniband-diags from `ib_tools` against the real stack on the model.
//!
//! infiniband-diags from `ib_tools` against the real stack (mlx4_core + mlx4_ib +
//! ib_core on the model): `smpquery` to this port goes through ib_core's SMI to
//! mlx4_ib's MAD_IFC and the model's firmware SMA, and prints what the device says
//! in libibmad's words; the queries that need a subnet (a LID, an SM) end with a
//! clear error. `ibping` to the node's own LID is answered by its own responder
//! while the ping itself polls ib_core. Two HCAs through the switch (perfquery of
//! the peer, the switch in smpquery, ibnetdiscover) are in `ib_tools_two_nodes.rs`.

use tests::mlx4_common;

use ib_core::verbs::PortState;
use ib_core::{DeviceId, IbCore};
use ib_tools::diags::{self, Src};
use ib_tools::ibping;
use mlx4_common::*;
use mlx4_core::Profile;
use mlx4_ib::Mlx4IbDev;

struct Stack {
    core: IbCore,
    id: DeviceId,
}

fn up(model: &Model) -> Stack {
    let dev = bring_up(model, Profile::default()).expect("mlx4_core up");
    let ib = Mlx4IbDev::add(dev, "mlx4_0").expect("mlx4_ib_add");
    let mut core = IbCore::new(model.clock());
    let id = core
        .register_device(Box::new(ib))
        .map_err(|e| e.error)
        .expect("registered");
    Stack { core, id }
}

fn down(mut s: Stack) {
    let mut provider = s.core.unregister_device(s.id).expect("unregistered");
    let ib = provider
        .as_any_mut()
        .and_then(|a| a.downcast_mut::<Mlx4IbDev>())
        .expect("mlx4_ib");
    ib.remove();
}

type Tool = fn(&mut IbCore, Src, &[&str], &mut dyn std::fmt::Write) -> Result<(), String>;

fn run(s: &mut Stack, port: u8, tool: Tool, args: &[&str]) -> Result<String, String> {
    let mut out = String::new();
    tool(&mut s.core, Src { dev: s.id, port }, args, &mut out).map(|()| out)
}

#[test]
fn smpquery_of_this_port_prints_what_the_firmware_sma_says() {
    let model = sync_hca();
    let mut s = up(&model);
    let guid = s.core.device(s.id).unwrap().info().node_guid;

    let t = run(&mut s, 1, diags::smpquery, &["nodeinfo"]).expect("nodeinfo");
    assert!(
        t.starts_with("# Node info: DR path slid 65535; dlid 65535; 0\n"),
        "{t}"
    );
    assert!(
        t.contains("NodeType:........................Channel Adapter\n"),
        "{t}"
    );
    assert!(t.contains("NumPorts:........................2\n"), "{t}");
    assert!(
        t.contains(&format!("Guid:............................{guid:#018x}\n")),
        "{t}"
    );
    assert!(
        t.contains("DevId:...........................0x1003\n"),
        "{t}"
    );
    assert!(
        t.contains("VendorId:........................0x0002c9\n"),
        "{t}"
    );
    // The same through an explicit directed route of this port.
    let d = run(&mut s, 1, diags::smpquery, &["-D", "nodeinfo", "0"]).expect("-D 0");
    assert_eq!(d, t);
    // From port 2 the SMA answers for port 2.
    let t2 = run(&mut s, 2, diags::smpquery, &["nodeinfo"]).expect("port 2");
    assert!(t2.contains("LocalPort:.......................2\n"), "{t2}");

    let t = run(&mut s, 1, diags::smpquery, &["nodedesc"]).expect("nodedesc");
    assert!(t.starts_with("Node Description:"), "{t}");
    assert!(
        t.trim_end().len() > "Node Description:.".len(),
        "a description: {t}"
    );

    let t = run(&mut s, 1, diags::smpquery, &["portinfo"]).expect("portinfo");
    assert!(
        t.starts_with("# Port info: DR path slid 65535; dlid 65535; 0 port 1\n"),
        "{t}"
    );
    // No SM has been here: the link is up, the port is not Active, no LID.
    assert!(
        t.contains("LinkState:.......................Initialize\n"),
        "{t}"
    );
    assert!(
        t.contains("PhysLinkState:...................LinkUp\n"),
        "{t}"
    );
    assert!(t.contains("Lid:.............................0\n"), "{t}");
    assert!(
        t.contains("GidPrefix:.......................0xfe80000000000000\n"),
        "{t}"
    );
    let t = run(&mut s, 1, diags::smpquery, &["portinfo", "0", "2"]);
    // A LID destination of 0 is refused before anything is sent.
    assert!(t.unwrap_err().contains("not a unicast LID"));
    let t = run(&mut s, 1, diags::smpquery, &["-D", "portinfo", "0", "2"]).expect("port 2");
    assert!(
        t.starts_with("# Port info: DR path slid 65535; dlid 65535; 0 port 2\n"),
        "{t}"
    );

    down(s);
    model.finish();
}

#[test]
fn queries_that_need_a_subnet_say_so() {
    let model = sync_hca();
    let mut s = up(&model);
    let e = run(&mut s, 1, diags::sminfo, &[]).unwrap_err();
    assert!(e.contains("knows no subnet manager"), "{e}");
    let e = run(&mut s, 1, diags::perfquery, &[]).unwrap_err();
    assert!(e.contains("no LID yet"), "{e}");
    let e = run(&mut s, 1, diags::smpquery, &["bogus"]).unwrap_err();
    assert!(e.contains("unknown operation 'bogus'"), "{e}");
    let e = run(&mut s, 1, diags::smpquery, &[]).unwrap_err();
    assert!(e.starts_with("usage: smpquery"), "{e}");
    let e = run(&mut s, 1, diags::smpquery, &["-D", "nodeinfo", "1,2"]).unwrap_err();
    assert!(e.contains("must start at this port"), "{e}");
    let e = run(&mut s, 1, diags::perfquery, &["-q"]).unwrap_err();
    assert!(e.contains("unknown option '-q'"), "{e}");
    // The ports each takes, in its message (perfquery's 255 is "all
    // ports"; no node has a port 255 to ask the SMA about), refused before
    // anything is sent.
    let e = run(&mut s, 1, diags::perfquery, &["1", "256"]).unwrap_err();
    assert_eq!(e, "bad port '256' (0 to 254, or 255 for all ports)");
    let e = run(&mut s, 1, diags::smpquery, &["-D", "portinfo", "0", "255"]).unwrap_err();
    assert_eq!(e, "bad port '255' (0 to 254)");
    down(s);
    model.finish();
}

/// `ibping` to this node's own LID (issue 21, item 7): the card loops the
/// ping back to its own QP1 and the responder answers it, although nothing
/// but the running `ibping` polls ib_core, as in the kernel where a console
/// command holds the adapters and the idle loop does not run: the responder
/// is an ib_core client, dispatched by the progress function every
/// blocking helper calls.
#[test]
fn ibping_to_its_own_lid_is_answered_while_the_ping_polls() {
    let model = sync_hca();
    let mut s = up(&model);
    let warned = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let w = warned.clone();
    s.core
        .register_client(Box::new(ibping::ResponderClient::new(Box::new(move |l| {
            w.lock().unwrap().push(l.to_string())
        }))));
    // What an SM does: a LID, then Armed and Active.
    const LID: u16 = 0x11;
    assert!(tests::sm::sm_activate(&model, 1, LID, LID));
    let id = s.id;
    let active = s.core.poll_until(std::time::Duration::from_secs(5), |c| {
        let pc = c.device(id)?.port_cache(1).ok()?;
        (pc.state == Some(PortState::Active) && pc.lid == LID).then_some(())
    });
    assert!(active.is_ok(), "port 1 Active with LID {LID} in ib_core");
    let desc = s.core.device(id).unwrap().info().node_desc.clone();
    let mut out = String::new();
    let mut never = || false;
    let r = ibping::ibping(
        &mut s.core,
        None,
        Src { dev: id, port: 1 },
        &["-c", "2", &LID.to_string()],
        &mut never,
        &mut out,
    );
    assert!(r.is_ok(), "{r:?}\n{out}");
    let pong = format!("Pong from {desc} (Lid {LID}): time ");
    assert_eq!(out.matches(&pong).count(), 2, "{pong:?} twice:\n{out}");
    assert!(
        out.contains("2 packets transmitted, 2 received, 0% packet loss"),
        "{out}"
    );
    assert!(warned.lock().unwrap().is_empty(), "{:?}", warned.lock());
    let c = s
        .core
        .client_by_name(ibping::ResponderClient::NAME)
        .expect("the responder client");
    drop(s.core.unregister_client(c));
    down(s);
    model.finish();
}
