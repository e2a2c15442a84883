//! Guest RAM as a vfio-user device reaches it, and the UAR pages the guest maps.
//!
//! The client's DMA mappings (`dma_map` with the file of guest RAM, which must be
//! `share=on`), by I/O virtual address, which is guest-physical (no vIOMMU); an
//! address outside every mapping is a DMA fault, never a crash. [`UarPages`] is
//! the other direction: a file of ours the client maps into the guest as BAR2.

use std::any::Any;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, RwLock};

use memmap2::{MmapOptions, MmapRaw};

use crate::hca::mem::{DmaFault, DmaFaultKind, HostMemory};
use crate::hca::regs::RegFile;

/// One `dma_map`: `[iova, iova + len)` is the client's file from `offset`.
struct DmaRegion {
    iova: u64,
    len: u64,
    map: MmapRaw,
}

/// Guest RAM as the device reaches it: the client's DMA mappings, by I/O
/// virtual address (= guest-physical); an address outside every mapping is
/// a DMA fault.
#[derive(Default)]
pub struct GuestMemory {
    regions: RwLock<Vec<DmaRegion>>,
}

fn fault(bus: u64, len: usize, write: bool) -> DmaFault {
    DmaFault {
        bus,
        len,
        write,
        kind: DmaFaultKind::OutOfRange,
    }
}

impl GuestMemory {
    /// Maps `len` bytes of `file` from `offset` at `iova`. Overlapping an
    /// existing mapping is refused.
    pub fn map(&self, iova: u64, len: u64, file: &File, offset: u64) -> Result<(), String> {
        let end = iova
            .checked_add(len)
            .ok_or_else(|| format!("DMA map {iova:#x}+{len:#x} wraps"))?;
        if len == 0 {
            return Err("DMA map of zero bytes".into());
        }
        let n = usize::try_from(len).map_err(|_| format!("DMA map of {len:#x} bytes"))?;
        let map = MmapOptions::new()
            .offset(offset)
            .len(n)
            .map_raw(file)
            .map_err(|e| format!("DMA map {iova:#x}+{len:#x}: mmap failed: {e}"))?;
        let mut r = self.regions.write().unwrap_or_else(|e| e.into_inner());
        if r.iter().any(|x| iova < x.iova + x.len && x.iova < end) {
            return Err(format!("DMA map {iova:#x}+{len:#x} overlaps a mapping"));
        }
        r.push(DmaRegion { iova, len, map });
        r.sort_by_key(|x| x.iova);
        Ok(())
    }

    /// Removes every mapping inside `[iova, iova + len)`; the number removed.
    pub fn unmap(&self, iova: u64, len: u64) -> usize {
        let end = iova.saturating_add(len);
        let mut r = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let before = r.len();
        r.retain(|x| !(x.iova >= iova && x.iova + x.len <= end));
        before - r.len()
    }

    /// The mapped ranges as (iova, len).
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let r = self.regions.read().unwrap_or_else(|e| e.into_inner());
        r.iter().map(|x| (x.iova, x.len)).collect()
    }

    /// Visits `[bus, bus + len)` piece by piece across adjacent mappings:
    /// `f(pointer, offset in the access, bytes)`; a hole is a fault.
    fn walk(
        &self,
        bus: u64,
        len: usize,
        write: bool,
        mut f: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), DmaFault> {
        let r = self.regions.read().unwrap_or_else(|e| e.into_inner());
        bus.checked_add(len as u64).ok_or(fault(bus, len, write))?;
        let mut done = 0usize;
        while done < len {
            let at = bus + done as u64;
            let i = r.partition_point(|x| x.iova + x.len <= at);
            let Some(reg) = r.get(i).filter(|x| x.iova <= at) else {
                return Err(fault(bus, len, write));
            };
            let off = (at - reg.iova) as usize;
            let n = (reg.len as usize - off).min(len - done);
            f(reg.map.as_mut_ptr().wrapping_add(off), done, n);
            done += n;
        }
        Ok(())
    }
}

impl HostMemory for GuestMemory {
    fn read(&self, bus: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let dst = buf.as_mut_ptr();
        let len = buf.len();
        // Check first, copy second: a faulting access copies nothing.
        self.walk(bus, len, false, |_, _, _| {})?;
        self.walk(bus, len, false, |p, at, n| {
            // SAFETY: `p..p+n` lies inside a live mapping (walk holds the
            // read lock, so no unmap can race), `dst + at..+n` inside `buf`;
            // guest RAM is another party's memory, never a Rust reference.
            unsafe { core::ptr::copy_nonoverlapping(p, dst.add(at), n) }
        })?;
        fence(Ordering::Acquire);
        Ok(())
    }

    fn write(&self, bus: u64, buf: &[u8]) -> Result<(), DmaFault> {
        self.walk(bus, buf.len(), true, |_, _, _| {})?;
        fence(Ordering::Release);
        self.walk(bus, buf.len(), true, |p, at, n| {
            // SAFETY: as in `read`, the other direction.
            unsafe { core::ptr::copy_nonoverlapping(buf.as_ptr().add(at), p, n) }
        })
    }
}

/// BAR2 as memory: an anonymous shared file of the BAR's size that the
/// client maps into the guest (the vfio-user region's file, from offset 0)
/// and that is, mapped here too, the model's BAR2 register file. The
/// guest's doorbells are plain stores into it; the model polls the doorbell
/// words of its live objects ([`crate::hca::device::Hca::poll_doorbells`]).
pub struct UarPages {
    file: File,
    regs: Arc<RegFile>,
    len: usize,
}

impl UarPages {
    /// A zeroed file of `len` bytes (a multiple of 4 KiB), mapped.
    pub fn new(len: usize) -> Result<UarPages, String> {
        if len == 0 || !len.is_multiple_of(4096) {
            return Err(format!("UAR pages of {len:#x} bytes"));
        }
        // SAFETY: creates a new anonymous file; the name is a valid C string.
        let fd = unsafe { libc::memfd_create(c"cx3-vfu-bar2".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "memfd_create for BAR2: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64)
            .map_err(|e| format!("sizing the BAR2 file: {e}"))?;
        let map = MmapRaw::map_raw(&file).map_err(|e| format!("mapping the BAR2 file: {e}"))?;
        let ptr = core::ptr::NonNull::new(map.as_mut_ptr().cast::<u32>())
            .ok_or("mapping the BAR2 file: null")?;
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(map);
        // SAFETY: the mapping is page aligned, `len` bytes long and lives as
        // long as `owner`, which the file holds; this process touches it
        // only through the register file's atomics, and the other party is
        // the guest, whose doorbell stores are single aligned dwords or
        // qwords.
        let regs = unsafe { RegFile::from_shared(owner, ptr, len / 4) };
        Ok(UarPages {
            file,
            regs: Arc::new(regs),
            len,
        })
    }

    /// The file the client maps (the region's `mmap_fd`).
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The mapping as the model's register file.
    pub fn regs(&self) -> Arc<RegFile> {
        self.regs.clone()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (`new` refuses an empty file).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Zeroes every page (a reset: doorbells stored before it and not yet
    /// taken must not be taken after it), giving the memory back.
    pub fn clear(&self) {
        // SAFETY: punches a hole in our own file; both mappings then read
        // zeros there. No memory of this process is passed.
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                self.len as libc::off_t,
            )
        };
        if r != 0 {
            self.regs.clear(0, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn memfd(len: u64) -> File {
        // SAFETY: a fresh anonymous file; the name is a valid C string.
        let fd = unsafe { libc::memfd_create(c"vfu-test".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: `fd` is ours and open.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    #[test]
    fn guest_memory_spans_adjacent_mappings_and_faults_in_holes() {
        let m = GuestMemory::default();
        let f = memfd(0x30_0000);
        // Like QEMU's q35 layout: [0, 0xa0000) and [0x100000, 0x300000)
        // from one RAM file, split at 2 MiB into two maps.
        m.map(0, 0xa_0000, &f, 0).unwrap();
        m.map(0x10_0000, 0x10_0000, &f, 0x10_0000).unwrap();
        m.map(0x20_0000, 0x10_0000, &f, 0x20_0000).unwrap();
        assert!(m.map(0x1f_f000, 0x2000, &f, 0).is_err(), "overlap refused");
        let data: Vec<u8> = (0..64u8).collect();
        m.write(0x1f_ffe0, &data).unwrap();
        let mut back = [0u8; 64];
        m.read(0x1f_ffe0, &mut back).unwrap();
        assert_eq!(&back[..], &data[..]);
        let e = m.read(0x9_fffc, &mut back[..8]).unwrap_err();
        assert_eq!((e.bus, e.len, e.write), (0x9_fffc, 8, false));
        assert!(m.write(0x30_0000 - 4, &[0; 8]).is_err(), "beyond the end");
        assert!(m.write(u64::MAX - 2, &[0; 8]).is_err(), "wraps");
        // A faulting write copies nothing.
        m.write(0x2f_fff8, &[7; 8]).unwrap();
        assert!(m.write(0x2f_fff8, &[9; 16]).is_err());
        m.read(0x2f_fff8, &mut back[..8]).unwrap();
        assert_eq!(back[..8], [7; 8]);
        assert_eq!(m.unmap(0x20_0000, 0x10_0000), 1);
        assert!(m.read(0x20_0000, &mut back[..4]).is_err());
    }

    #[test]
    fn uar_pages_are_one_memory_through_the_file_and_the_register_file() {
        use std::os::unix::fs::FileExt;
        let u = UarPages::new(0x2000).unwrap();
        assert!(UarPages::new(0x1001).is_err());
        // What the client (the guest) stores through its own mapping of the
        // file is what the register file reads, and the other way round.
        // SAFETY: `dup` of a descriptor we own; the copy is ours.
        let dup = unsafe { File::from_raw_fd(libc::dup(u.fd())) };
        dup.write_all_at(&0x1234_5678u32.to_ne_bytes(), 0x1014)
            .unwrap();
        assert_eq!(u.regs().raw(0x1014), 0x1234_5678);
        u.regs().set_raw(0x20, 7);
        let mut b = [0u8; 4];
        dup.read_exact_at(&mut b, 0x20).unwrap();
        assert_eq!(u32::from_ne_bytes(b), 7);
        u.clear();
        assert_eq!((u.regs().raw(0x1014), u.regs().raw(0x20)), (0, 0));
    }
}
