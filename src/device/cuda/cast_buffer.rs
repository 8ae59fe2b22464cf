//! A growable device buffer on CUDA virtual memory management.
//!
//! The address range is reserved once (`cuMemAddressReserve`); physical memory is
//! created and mapped into it chunk by chunk (`cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`) as the buffer grows, and unmapped from the top when it shrinks.
//! Growing never moves the base address, copies data or fragments VRAM. The chunk
//! bookkeeping is [`ChunkPlan`]; this file is only the driver calls around it.

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use stagehand_actors::DevicePtr;

use super::chunk_plan::ChunkPlan;
use super::error::CudaError;
use super::events::make_current;

pub struct CastBuffer {
    base: sys::CUdeviceptr,
    plan: ChunkPlan,
    /// The physical allocation behind each mapped chunk, index = chunk index.
    handles: Vec<sys::CUmemGenericAllocationHandle>,
    properties: sys::CUmemAllocationProp,
    context: Arc<CudaContext>,
}

// SAFETY: the raw handles are plain driver identifiers; every method binds the context
// before using them, and `&mut self` serialises mapping changes.
unsafe impl Send for CastBuffer {}
unsafe impl Sync for CastBuffer {}

fn device_memory_properties(context: &CudaContext) -> sys::CUmemAllocationProp {
    // SAFETY: the struct is plain C data for which all-zero is the documented default
    // (no handle types, no flags, null metadata).
    let mut properties: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    properties.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    properties.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    properties.location.id = context.cu_device();
    properties
}

impl CastBuffer {
    /// Reserves `max_bytes` of address space (rounded down to whole chunks) with nothing
    /// mapped. `chunk_bytes_hint` is rounded up to the driver's recommended granularity.
    pub fn new(
        context: &Arc<CudaContext>,
        max_bytes: u64,
        chunk_bytes_hint: u64,
    ) -> Result<Self, CudaError> {
        context
            .bind_to_thread()
            .map_err(CudaError::driver("cuCtxSetCurrent"))?;
        let supported = context
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            )
            .map_err(CudaError::driver("cuDeviceGetAttribute"))?;
        if supported == 0 {
            return Err(CudaError::InvalidArgument(
                "this GPU or driver does not support virtual memory management, which the \
                 cast buffers need"
                    .to_string(),
            ));
        }
        let properties = device_memory_properties(context);
        let mut granularity_bytes = 0usize;
        // SAFETY: valid out-pointer and a fully initialised property struct.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity_bytes,
                &properties,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        }
        .result()
        .map_err(CudaError::driver("cuMemGetAllocationGranularity"))?;
        let plan = ChunkPlan::new(granularity_bytes as u64, chunk_bytes_hint, max_bytes)?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the size is a whole number of granules.
        unsafe { sys::cuMemAddressReserve(&mut base, plan.reservation_bytes() as usize, 0, 0, 0) }
            .result()
            .map_err(CudaError::driver("cuMemAddressReserve"))?;
        Ok(Self {
            base,
            plan,
            handles: Vec::new(),
            properties,
            context: context.clone(),
        })
    }

    /// Start of the buffer; stable for the buffer's whole life.
    pub fn base(&self) -> DevicePtr {
        DevicePtr(self.base)
    }

    /// Physical VRAM currently mapped: what counts against the budget.
    pub fn mapped_bytes(&self) -> u64 {
        self.plan.mapped_bytes()
    }

    pub fn reservation_bytes(&self) -> u64 {
        self.plan.reservation_bytes()
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.plan.chunk_bytes()
    }

    /// Maps chunks until at least `bytes` are usable. Chunks already mapped stay where
    /// they are. On an error the chunks mapped so far stay mapped and are accounted.
    pub fn grow_to(&mut self, bytes: u64) -> Result<(), CudaError> {
        let change = self.plan.plan_grow(bytes)?;
        if change.map.is_empty() {
            return Ok(());
        }
        self.context
            .bind_to_thread()
            .map_err(CudaError::driver("cuCtxSetCurrent"))?;
        for index in change.map {
            let handle = self.map_chunk(index)?;
            self.plan.record_mapped(index)?;
            self.handles.push(handle);
        }
        Ok(())
    }

    fn map_chunk(&self, index: usize) -> Result<sys::CUmemGenericAllocationHandle, CudaError> {
        let chunk_bytes = self.plan.chunk_bytes() as usize;
        let address = self.base + self.plan.chunk_offset(index);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and property struct; the size is a whole number of
        // granules.
        unsafe { sys::cuMemCreate(&mut handle, chunk_bytes, &self.properties, 0) }
            .result()
            .map_err(CudaError::driver("cuMemCreate"))?;
        // SAFETY: `address .. address + chunk_bytes` lies inside our reservation and is
        // unmapped (the plan only hands out chunks past the mapped prefix).
        let mapped = unsafe { sys::cuMemMap(address, chunk_bytes, 0, handle, 0) }.result();
        if let Err(error) = mapped {
            // SAFETY: the handle was created above and is not mapped anywhere.
            let _ = unsafe { sys::cuMemRelease(handle) };
            return Err(CudaError::driver("cuMemMap")(error));
        }
        let access = sys::CUmemAccessDesc {
            location: self.properties.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; one access descriptor is passed.
        let accessible = unsafe { sys::cuMemSetAccess(address, chunk_bytes, &access, 1) }.result();
        if let Err(error) = accessible {
            // SAFETY: undo the mapping made above, then release its handle.
            unsafe {
                let _ = sys::cuMemUnmap(address, chunk_bytes);
                let _ = sys::cuMemRelease(handle);
            }
            return Err(CudaError::driver("cuMemSetAccess")(error));
        }
        Ok(handle)
    }

    /// Unmaps chunks from the top so that only those holding `keep_bytes` stay mapped.
    /// Waits for all queued work first: a kernel or copy may still use the chunks.
    pub fn shrink_to(&mut self, keep_bytes: u64) -> Result<(), CudaError> {
        let change = self.plan.plan_shrink(keep_bytes);
        if change.unmap.is_empty() {
            return Ok(());
        }
        make_current(&self.context)?;
        cudarc::driver::result::ctx::synchronize()
            .map_err(CudaError::driver("cuCtxSynchronize"))?;
        for index in change.unmap.rev() {
            self.unmap_chunk(index)?;
            self.plan.record_unmapped(index)?;
            self.handles.pop();
        }
        Ok(())
    }

    fn unmap_chunk(&self, index: usize) -> Result<(), CudaError> {
        let chunk_bytes = self.plan.chunk_bytes() as usize;
        let address = self.base + self.plan.chunk_offset(index);
        let Some(&handle) = self.handles.get(index) else {
            return Err(CudaError::InvalidArgument(format!(
                "cast buffer chunk {index} has no allocation handle"
            )));
        };
        // SAFETY: chunk `index` is mapped (it is inside the mapped prefix) and no work
        // uses it (the caller synchronized).
        unsafe { sys::cuMemUnmap(address, chunk_bytes) }
            .result()
            .map_err(CudaError::driver("cuMemUnmap"))?;
        // SAFETY: the handle's only mapping was removed above.
        unsafe { sys::cuMemRelease(handle) }
            .result()
            .map_err(CudaError::driver("cuMemRelease"))
    }
}

impl Drop for CastBuffer {
    fn drop(&mut self) {
        if let Err(error) = self.shrink_to(0) {
            tracing::warn!(%error, "could not unmap a cast buffer; its VRAM leaks until exit");
            return;
        }
        // SAFETY: nothing is mapped in the reservation any more; it is freed once.
        let freed =
            unsafe { sys::cuMemAddressFree(self.base, self.plan.reservation_bytes() as usize) }
                .result();
        if let Err(error) = freed {
            tracing::warn!(%error, "cuMemAddressFree failed");
        }
    }
}
