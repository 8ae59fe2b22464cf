//! No tiles off x86-64: `available` is false there, so nothing below runs.

pub(super) struct Accumulators(pub [f32; 1024]);
impl Default for Accumulators {
    fn default() -> Self {
        Self([0.0; 1024])
    }
}
pub(super) unsafe fn configure() {
    unreachable!("AMX is x86-64 only")
}
pub(super) unsafe fn release() {}
pub(super) unsafe fn multiply(
    _: *const u16,
    _: usize,
    _: (*const u16, usize),
    _: (usize, bool),
    _: &mut Accumulators,
) {
    unreachable!("AMX is x86-64 only")
}
pub(super) unsafe fn store_transposed(
    _: &[f32],
    _: (*mut f32, usize),
    _: (usize, usize),
    _: f32,
    _: Option<&[f32]>,
) {
    unreachable!("AMX is x86-64 only")
}
