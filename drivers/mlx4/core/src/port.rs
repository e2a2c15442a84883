//! The port commands mlx4_ib and bring-up issue, as Linux's `port.c` and `fw.c` have them.
//!
//! Linux: `port.c` (`mlx4_get_port_ib_caps`, `mlx4_SET_PORT`) and `fw.c`
//! (`mlx4_INIT_PORT`, `mlx4_CLOSE_PORT`, `mlx4_MAD_IFC`): the default IB
//! port capabilities by MAD_IFC, SET_PORT (IB), INIT_PORT and CLOSE_PORT.
//! MAC/VLAN tables and the Ethernet SET_PORT flavours are left out.

use hal::be::get_be32;
use mlx4_hw::cmd::{Opcode, errno, timeout};
use mlx4_hw::port::*;

use crate::cmd::Mailbox;
use crate::dev::{Dev, PortType};
use crate::fw;
use crate::{Error, Result};

impl Dev {
    fn check_port(&self, port: u8) -> Result<()> {
        if port == 0 || port > self.hca.caps.num_ports {
            return Err(Error::InvalidArg);
        }
        Ok(())
    }

    /// Linux `mlx4_get_port_ib_caps`: SubnGet(PortInfo) through MAD_IFC
    /// (ignore M_Key and B_Key); returns the capability mask.
    pub fn get_port_ib_caps(&mut self, port: u8) -> Result<u32> {
        self.check_port(port)?;
        let inb = Mailbox::new(&self.hca.pool)?;
        let outb = Mailbox::new(&self.hca.pool)?;
        inb.write(0, &port_info_query(port));
        self.hca.cmd.cmd_box(
            inb.dma(),
            outb.dma(),
            u32::from(port),
            MAD_IFC_IGNORE_KEYS,
            Opcode::MAD_IFC,
            timeout::CLASS_C,
        )?;
        let o: [u8; MAD_SIZE] = outb.read();
        Ok(get_be32(&o, PORT_INFO_CAP_MASK_OFFSET))
    }

    /// Linux `mlx4_SET_PORT` (IB): MTU cap and the default capability mask,
    /// retrying with a smaller VL cap (8, 4, 2, 1) while the firmware answers
    /// EXCEED_LIM. Ethernet ports are left alone.
    #[doc(alias = "mlx4_SET_PORT")]
    pub fn set_port(&mut self, port: u8) -> Result<()> {
        self.check_port(port)?;
        let pc = self.hca.caps.port[usize::from(port)];
        if pc.port_type == PortType::Eth {
            return Ok(());
        }
        let mb = Mailbox::new(&self.hca.pool)?;
        let mut vl_cap = 8;
        loop {
            mb.write(
                0,
                &set_port_ib(u32::from(pc.port_ib_mtu), vl_cap, pc.ib_port_def_cap, None),
            );
            let r = self.hca.cmd.cmd(
                mb.dma(),
                u32::from(port),
                0,
                Opcode::SET_PORT,
                timeout::CLASS_B,
            );
            match r {
                Err(e) if e.to_errno() == -errno::ENOMEM && vl_cap > 1 => vl_cap >>= 1,
                r => return r,
            }
        }
    }

    /// SET_PORT (IB) with a new capability mask and nothing else changed,
    /// as mlx4_ib's `mlx4_SET_PORT` sends it for `ib_modify_port` (an SM
    /// setting IsSM on its port).
    pub fn set_port_cap_mask(
        &mut self,
        port: u8,
        cap_mask: u32,
        reset_qkey_cntrs: bool,
    ) -> Result<()> {
        self.check_port(port)?;
        let mb = Mailbox::new(&self.hca.pool)?;
        mb.write(0, &set_port_ib_cap_mask(cap_mask, reset_qkey_cntrs));
        self.hca.cmd.cmd(
            mb.dma(),
            u32::from(port),
            0,
            Opcode::SET_PORT,
            timeout::CLASS_B,
        )
    }

    /// SET_PORT op_mod 1 (Ethernet), GID_TABLE (5): the port's RoCE GID
    /// table, `gids` from index 0 and the rest of the 128 entries zero
    /// (Linux mlx4_ib's `update_gids_task`). For mlx4_ib on an Ethernet
    /// port only.
    pub fn set_port_gid_table(&mut self, port: u8, gids: &[[u8; 16]]) -> Result<()> {
        self.check_port(port)?;
        if gids.len() > 128 {
            return Err(Error::InvalidArg);
        }
        let mb = Mailbox::new(&self.hca.pool)?;
        for (i, g) in gids.iter().enumerate() {
            mb.write(i * 16, g);
        }
        self.hca.cmd.cmd(
            mb.dma(),
            (5 << 8) | u32::from(port),
            1,
            Opcode::SET_PORT,
            timeout::CLASS_B,
        )
    }

    /// Linux `mlx4_INIT_PORT` (issued by mlx4_ib when QP0 reaches RTR).
    #[doc(alias = "mlx4_INIT_PORT")]
    pub fn init_port(&mut self, port: u8) -> Result<()> {
        self.check_port(port)?;
        fw::init_port(&mut self.hca.cmd, port)?;
        self.port_open[usize::from(port)] = true;
        Ok(())
    }

    /// Linux `mlx4_CLOSE_PORT`.
    #[doc(alias = "mlx4_CLOSE_PORT")]
    pub fn close_port(&mut self, port: u8) -> Result<()> {
        self.check_port(port)?;
        self.port_open[usize::from(port)] = false;
        fw::close_port(&mut self.hca.cmd, port)
    }

    /// True while the port is open (INIT_PORT done, no CLOSE_PORT since).
    pub fn port_is_open(&self, port: u8) -> bool {
        self.port_open
            .get(usize::from(port))
            .copied()
            .unwrap_or(false)
    }

    /// MAD_IFC for mlx4_ib (Linux `mlx4_MAD_IFC` native path): `mad_in` (256
    /// bytes, plus the optional extended info block at 0x100) in, response
    /// MAD out.
    pub fn mad_ifc(
        &mut self,
        port: u8,
        op_mod: u8,
        in_mod_hi: u16,
        mad_in: &[u8],
    ) -> Result<[u8; MAD_SIZE]> {
        self.check_port(port)?;
        if mad_in.len() > 4096 {
            return Err(Error::InvalidArg);
        }
        let inb = Mailbox::new(&self.hca.pool)?;
        let outb = Mailbox::new(&self.hca.pool)?;
        inb.write(0, mad_in);
        let in_mod = u32::from(port) | (u32::from(in_mod_hi) << 16);
        self.hca.cmd.cmd_box(
            inb.dma(),
            outb.dma(),
            in_mod,
            op_mod,
            Opcode::MAD_IFC,
            timeout::CLASS_C,
        )?;
        Ok(outb.read())
    }
}
