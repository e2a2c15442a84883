//! The InfiniBand commands of the shell: `ibv_devinfo`, `ibstat`, `mlx4`,
//! `fwtrace`. Field names, words and numbers follow the Linux tools
//! (rdma-core's `ibv_devinfo`, infiniband-diags' `ibstat`).

use alloc::string::{String, ToString};
use core::fmt::Write;

use crate::console::CmdResult;
use crate::hca::{self, Guid, Hca};

/// Runs `f` on every HCA, or only on the one named `only`; no HCA at all,
/// or no HCA of that name, is an error (`missing` words the latter).
fn for_hcas(
    only: Option<&str>,
    missing: impl FnOnce(&str) -> String,
    mut f: impl FnMut(&mut Hca) -> CmdResult,
) -> CmdResult {
    hca::with(|hcas| {
        if hcas.is_empty() {
            return Err(
                "no HCA (no ConnectX-3 found, or its bring-up failed: see dmesg)".to_string(),
            );
        }
        let mut found = false;
        for h in hcas.iter_mut().filter(|h| only.is_none_or(|n| n == h.name)) {
            found = true;
            f(h)?;
        }
        match only {
            Some(name) if !found => Err(missing(name)),
            _ => Ok(()),
        }
    })
}

/// NodeInfo, with a console-ready error.
fn node(h: &mut Hca) -> Result<hca::NodeAttr, String> {
    hca::node_attr(&mut h.dev).map_err(|e| alloc::format!("{}: NodeInfo query failed: {e}", h.name))
}

/// PortInfo, with a console-ready error.
fn port(h: &mut Hca, port: u8) -> Result<hca::PortAttr, String> {
    hca::port_attr(&mut h.dev, port)
        .map_err(|e| alloc::format!("{}: PortInfo query failed: {e}", h.name))
}

fn devinfo(out: &mut dyn Write, h: &mut Hca, verbose: bool) -> CmdResult {
    let node = node(h)?;
    let caps = h.dev.caps().clone();
    let _ = writeln!(out, "hca_id:\t{}", h.name);
    let _ = writeln!(out, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(out, "\tfw_ver:\t\t\t\t{}", h.dev.fw_ver_string());
    let _ = writeln!(out, "\tnode_guid:\t\t\t{}", Guid(node.node_guid));
    let _ = writeln!(out, "\tsys_image_guid:\t\t\t{}", Guid(node.sys_image_guid));
    let _ = writeln!(out, "\tvendor_id:\t\t\t{:#06x}", node.vendor_id);
    let _ = writeln!(out, "\tvendor_part_id:\t\t\t{}", h.pci.device);
    let _ = writeln!(out, "\thw_ver:\t\t\t\t{:#x}", node.revision);
    let _ = writeln!(out, "\tboard_id:\t\t\t{}", h.dev.board_id());
    let _ = writeln!(out, "\tphys_port_cnt:\t\t\t{}", caps.num_ports);
    if verbose {
        let _ = writeln!(out, "\tmax_mr_size:\t\t\t0xffffffffffffffff");
        let _ = writeln!(out, "\tpage_size_cap:\t\t\t{:#x}", caps.page_size_cap);
        let _ = writeln!(
            out,
            "\tmax_qp:\t\t\t\t{}",
            caps.num_qps.saturating_sub(caps.reserved_qps)
        );
        let _ = writeln!(out, "\tmax_qp_wr:\t\t\t{}", caps.max_wqes);
        let _ = writeln!(
            out,
            "\tmax_sge:\t\t\t{}",
            caps.max_sq_sg.min(caps.max_rq_sg)
        );
        let _ = writeln!(
            out,
            "\tmax_cq:\t\t\t\t{}",
            caps.num_cqs.saturating_sub(caps.reserved_cqs)
        );
        let _ = writeln!(out, "\tmax_cqe:\t\t\t{}", caps.max_cqes);
        let _ = writeln!(
            out,
            "\tmax_mr:\t\t\t\t{}",
            caps.num_mpts.saturating_sub(caps.reserved_mrws)
        );
        let _ = writeln!(
            out,
            "\tmax_pd:\t\t\t\t{}",
            caps.num_pds.saturating_sub(caps.reserved_pds)
        );
        let _ = writeln!(out, "\tmax_qp_rd_atom:\t\t\t{}", caps.max_qp_dest_rdma);
        let _ = writeln!(out, "\tmax_qp_init_rd_atom:\t\t{}", caps.max_qp_init_rdma);
        let _ = writeln!(
            out,
            "\tmax_srq:\t\t\t{}",
            caps.num_srqs.saturating_sub(caps.reserved_srqs)
        );
        let _ = writeln!(
            out,
            "\tmax_srq_wr:\t\t\t{}",
            caps.max_srq_wqes.saturating_sub(1)
        );
        let _ = writeln!(out, "\tmax_srq_sge:\t\t\t{}", caps.max_srq_sge);
        let _ = writeln!(out, "\tmax_pkeys:\t\t\t{}", caps.port[1].pkey_table_len);
        let _ = writeln!(out, "\tlocal_ca_ack_delay:\t\t{}", caps.local_ca_ack_delay);
    }
    for port_num in 1..=caps.num_ports {
        let p = port(h, port_num)?;
        let _ = writeln!(out, "\t\tport:\t{port_num}");
        let _ = writeln!(
            out,
            "\t\t\tstate:\t\t\t{} ({})",
            hca::port_state_name(p.state),
            p.state
        );
        let _ = writeln!(
            out,
            "\t\t\tmax_mtu:\t\t{} ({})",
            hca::mtu_bytes(p.max_mtu),
            p.max_mtu
        );
        let _ = writeln!(
            out,
            "\t\t\tactive_mtu:\t\t{} ({})",
            hca::mtu_bytes(p.active_mtu),
            p.active_mtu
        );
        let _ = writeln!(out, "\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
        let _ = writeln!(out, "\t\t\tport_lid:\t\t{}", p.lid);
        let _ = writeln!(out, "\t\t\tport_lmc:\t\t{:#04x}", p.lmc);
        let _ = writeln!(out, "\t\t\tlink_layer:\t\tInfiniBand");
        if verbose {
            let pc = caps.port[usize::from(port_num)];
            let _ = writeln!(out, "\t\t\tmax_msg_sz:\t\t{:#x}", caps.max_msg_sz);
            let _ = writeln!(out, "\t\t\tport_cap_flags:\t\t{:#010x}", p.cap_mask);
            let _ = writeln!(out, "\t\t\tmax_vl_num:\t\t{}", pc.vl_cap);
            let _ = writeln!(out, "\t\t\tsm_sl:\t\t\t{}", p.sm_sl);
            let _ = writeln!(out, "\t\t\tgid_tbl_len:\t\t{}", pc.gid_table_len);
            let _ = writeln!(out, "\t\t\tpkey_tbl_len:\t\t{}", pc.pkey_table_len);
            let (g, t) = hca::rate(p.width, p.speed);
            let _ = writeln!(out, "\t\t\tactive_width:\t\t{}", width_name(p.width));
            let _ = writeln!(out, "\t\t\tactive_speed:\t\t{}", speed_name(p.speed));
            let _ = writeln!(
                out,
                "\t\t\tphys_state:\t\t{} ({})",
                hca::phys_state_name(p.phys_state).to_ascii_uppercase(),
                p.phys_state
            );
            let _ = writeln!(out, "\t\t\trate:\t\t\t{g}.{t} Gb/s");
        }
        let _ = writeln!(out);
    }
    Ok(())
}

fn width_name(w: u8) -> &'static str {
    match w {
        1 => "1X (1)",
        2 => "4X (2)",
        4 => "8X (4)",
        8 => "12X (8)",
        _ => "invalid width",
    }
}

fn speed_name(s: u8) -> &'static str {
    match s {
        1 => "2.5 Gbps (1)",
        2 => "5.0 Gbps (2)",
        4 => "10.0 Gbps (4)",
        _ => "invalid speed",
    }
}

/// `ibv_devinfo [-v] [-d mlx4_N]`.
pub fn ibv_devinfo(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let mut verbose = false;
    let mut only: Option<&str> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "-v" => verbose = true,
            "-d" => only = Some(it.next().ok_or("usage: ibv_devinfo [-v] [-d DEVICE]")?),
            _ => return Err("usage: ibv_devinfo [-v] [-d DEVICE]".to_string()),
        }
    }
    for_hcas(
        only,
        |n| alloc::format!("no device {n}"),
        |h| devinfo(out, h, verbose),
    )
}

/// `ibstat [CA]`.
pub fn ibstat(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    if args.len() > 1 {
        return Err("usage: ibstat [CA_NAME]".to_string());
    }
    for_hcas(
        args.first().copied(),
        |n| alloc::format!("CA '{n}' not found"),
        |h| {
            let node = node(h)?;
            let n = h.dev.caps().num_ports;
            let _ = writeln!(out, "CA '{}'", h.name);
            let _ = writeln!(out, "\tCA type: MT{}", h.pci.device);
            let _ = writeln!(out, "\tNumber of ports: {n}");
            let _ = writeln!(out, "\tFirmware version: {}", h.dev.fw_ver_string());
            let _ = writeln!(out, "\tHardware version: {:x}", node.revision);
            let _ = writeln!(out, "\tNode GUID: {:#018x}", node.node_guid);
            let _ = writeln!(out, "\tSystem image GUID: {:#018x}", node.sys_image_guid);
            for port_num in 1..=n {
                let p = port(h, port_num)?;
                let (g, t) = hca::rate(p.width, p.speed);
                let _ = writeln!(out, "\tPort {port_num}:");
                let _ = writeln!(out, "\t\tState: {}", hca::ibstat_state(p.state));
                let _ = writeln!(
                    out,
                    "\t\tPhysical state: {}",
                    hca::phys_state_name(p.phys_state)
                );
                if t == 0 {
                    let _ = writeln!(out, "\t\tRate: {g}");
                } else {
                    let _ = writeln!(out, "\t\tRate: {g}.{t}");
                }
                let _ = writeln!(out, "\t\tBase lid: {}", p.lid);
                let _ = writeln!(out, "\t\tLMC: {}", p.lmc);
                let _ = writeln!(out, "\t\tSM lid: {}", p.sm_lid);
                let _ = writeln!(out, "\t\tCapability mask: {:#010x}", p.cap_mask);
                let _ = writeln!(out, "\t\tPort GUID: {:#018x}", p.port_guid);
                let _ = writeln!(out, "\t\tLink layer: InfiniBand");
            }
            Ok(())
        },
    )
}

/// `mlx4 caps|catas|bench [N]`.
pub fn mlx4(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let usage = || "usage: mlx4 caps|catas|bench [N]".to_string();
    let (sub, rounds) = match args {
        [s] => (*s, 1000),
        ["bench", n] => (
            "bench",
            n.parse::<u32>()
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .ok_or_else(usage)?,
        ),
        _ => return Err(usage()),
    };
    for_hcas(
        None,
        |n| String::from(n),
        |h| {
            match sub {
                "caps" => hca::write_caps(out, h),
                "bench" => hca::bench(out, h, rounds),
                "catas" => {
                    let fw = *h.dev.fw_info();
                    let bad = h.dev.poll_catas();
                    let _ = writeln!(
                        out,
                        "{} ({}): internal error buffer at BAR{} + {:#x}, {} dwords: {}",
                        h.name,
                        h.pci.addr,
                        fw.catas_bar,
                        fw.catas_offset,
                        fw.catas_size,
                        if bad {
                            "ERROR reported (see dmesg for the dump)"
                        } else {
                            "clear"
                        }
                    );
                }
                _ => return Err(usage()),
            }
            Ok(())
        },
    )
}

/// `fwtrace on|off`: log every firmware command (mlx4_core::cmd at debug).
pub fn fwtrace(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let spec = match args {
        ["on"] => "mlx4_core::cmd=debug",
        ["off"] => "mlx4_core::cmd=info",
        _ => return Err("usage: fwtrace on|off".to_string()),
    };
    crate::logger::set_filter(spec).map_err(String::from)?;
    let _ = writeln!(
        out,
        "fwtrace: {}",
        if args[0] == "on" {
            "every firmware command is logged"
        } else {
            "off"
        }
    );
    Ok(())
}
