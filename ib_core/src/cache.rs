//! Port of Linux `drivers/infiniband/core/cache.c` (3.11): per-port copies of the GID and P_Key tables, LID, LMC, SM LID and SM SL, with `ib_get_cached_*`/`ib_find_cached_*`.
//!
//! As LegoOS runs it, the cache is refreshed synchronously on the event instead
//! of on a workqueue. RoCE GID management is left out.

use alloc::vec::Vec;

use crate::error::{Error, Result};
use crate::verbs::{EventType, Gid, IbDevice, PortState};

/// The cached view of one port (`struct ib_gid_cache` + `ib_pkey_cache` +
/// the LMC, plus the LID, SM LID, SM SL and state the kernel's `ibstat`
/// shows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortCache {
    /// GID table.
    pub gids: Vec<Gid>,
    /// P_Key table.
    pub pkeys: Vec<u16>,
    /// LMC.
    pub lmc: u8,
    /// Base LID.
    pub lid: u16,
    /// SM LID.
    pub sm_lid: u16,
    /// SM SL.
    pub sm_sl: u8,
    /// Port state at the last refresh.
    pub state: Option<PortState>,
    /// Refreshes done.
    pub updates: u32,
    /// Refreshes that failed (the previous contents were kept).
    pub failures: u32,
}

/// True for the events that make Linux's `ib_cache_event` refresh the port.
pub fn event_wants(ev: EventType) -> bool {
    matches!(
        ev,
        EventType::PortErr
            | EventType::PortActive
            | EventType::LidChange
            | EventType::PkeyChange
            | EventType::SmChange
            | EventType::ClientReregister
            | EventType::GidChange
    )
}

/// Linux `ib_cache_update`: reads the port's attributes, then every GID and
/// every P_Key, and replaces the cache only if all reads succeeded (a failed
/// refresh keeps the old contents and is counted).
#[doc(alias = "ib_cache_update")]
pub fn update(
    ops: &mut dyn IbDevice,
    port: u8,
    gid_tbl_len: u32,
    pkey_tbl_len: u16,
    cache: &mut PortCache,
) -> Result<()> {
    let r = (|| -> Result<PortCache> {
        let attr = ops.query_port(port)?;
        let mut gids = Vec::new();
        gids.try_reserve(gid_tbl_len as usize)
            .map_err(|_| Error::NoMem)?;
        gids.resize(gid_tbl_len as usize, Gid::default());
        ops.query_gid_table(port, &mut gids)?;
        let mut pkeys = Vec::new();
        pkeys
            .try_reserve(usize::from(pkey_tbl_len))
            .map_err(|_| Error::NoMem)?;
        pkeys.resize(usize::from(pkey_tbl_len), 0);
        ops.query_pkey_table(port, &mut pkeys)?;
        Ok(PortCache {
            gids,
            pkeys,
            lmc: attr.lmc,
            lid: attr.lid,
            sm_lid: attr.sm_lid,
            sm_sl: attr.sm_sl,
            state: Some(attr.state),
            updates: cache.updates,
            failures: cache.failures,
        })
    })();
    match r {
        Ok(mut fresh) => {
            fresh.updates = fresh.updates.wrapping_add(1);
            *cache = fresh;
            Ok(())
        }
        Err(e) => {
            cache.failures = cache.failures.wrapping_add(1);
            log::warn!("update: port {port}: {e}; keeping the old cache");
            Err(e)
        }
    }
}

impl PortCache {
    /// `ib_get_cached_gid`.
    pub fn get_gid(&self, index: usize) -> Result<Gid> {
        self.gids
            .get(index)
            .copied()
            .ok_or(Error::Invalid("GID index out of range"))
    }

    /// `ib_find_cached_gid` within this port: the first index holding `gid`.
    pub fn find_gid(&self, gid: &Gid) -> Option<usize> {
        self.gids.iter().position(|g| g == gid)
    }

    /// `ib_get_cached_pkey`.
    pub fn get_pkey(&self, index: usize) -> Result<u16> {
        self.pkeys
            .get(index)
            .copied()
            .ok_or(Error::Invalid("P_Key index out of range"))
    }

    /// `ib_find_cached_pkey`: the index of `pkey`, comparing the low 15 bits
    /// and preferring a full-membership entry over a limited one (as later
    /// Linux does; 3.11 took the first match).
    pub fn find_pkey(&self, pkey: u16) -> Result<u16> {
        let mut partial = None;
        for (i, &p) in self.pkeys.iter().enumerate() {
            if p & 0x7fff == pkey & 0x7fff {
                if p & 0x8000 != 0 {
                    return u16::try_from(i).map_err(|_| Error::NotFound);
                }
                partial.get_or_insert(i);
            }
        }
        partial
            .and_then(|i| u16::try_from(i).ok())
            .ok_or(Error::NotFound)
    }
}
