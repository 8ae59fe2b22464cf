//! What the operating system tells and does for every layer above: opening input files
//! so nothing can hang the process, page-cache advice, and how much host memory is free.
//! The lowest layer of `src/` (docs/architecture.md "Architecture"): it imports nothing of stagehand.

mod files;
mod memory;
mod page_cache;

pub use files::{
    create_regular, open_regular, read_regular, remove_stale_temporaries, write_atomically,
    FileStamp,
};
pub use memory::{
    advise_huge_pages, available_ram_bytes, flush_from_caches, release_freed_memory,
    total_ram_bytes,
};
pub use page_cache::{
    advise_dont_need, advise_will_need, cached_bytes, drop_page_cache, uncached_ranges,
    PageCacheView,
};
