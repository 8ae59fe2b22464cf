//! Decoding in tiles, as diffusers' `AutoencoderKL.tiled_decode` does when a latent is
//! larger than its tile (and as ComfyUI's tiled decode does when VRAM is short): the
//! latent is cut into squares of `tile` positions that overlap by a quarter, each
//! square is decoded alone, and each decoded tile is blended linearly into the one
//! above and the one to its left over a quarter of a tile's pixels, then cropped to
//! the stride. A tile's activations are those of a `tile`² decode, whatever the
//! image's size.
//!
//! And what a decode holds live: the working set of its largest stage, computed from
//! the shapes each stage allocates (see [`super::VaeDecoder`]'s stages), reserved
//! through the activation path before the first block.

use super::VaeConfig;

/// diffusers' `tile_overlap_factor`.
const OVERLAP: f64 = 0.25;

/// One tile: latent rows `row .. row + rows`, columns `col .. col + cols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    pub row: usize,
    pub col: usize,
    pub rows: usize,
    pub cols: usize,
}

/// How a latent of `height × width` positions is cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiling {
    /// The tile's side in latent positions; `None`: one tile, the whole latent.
    pub tile: Option<usize>,
    pub tiles: Vec<Tile>,
    /// Tiles per row of tiles.
    pub columns: usize,
    pub height: usize,
    pub width: usize,
    /// Pixels per latent position.
    pub scale: usize,
}

impl Tiling {
    /// The tiles of a `height × width` latent in squares of `tile` (`None`, or a tile
    /// at least the latent's size: one tile).
    pub fn new(height: usize, width: usize, tile: Option<usize>, scale: usize) -> Self {
        let tile = tile.filter(|&tile| tile > 0 && (height > tile || width > tile));
        let Some(side) = tile else {
            return Self {
                tile: None,
                tiles: vec![Tile {
                    row: 0,
                    col: 0,
                    rows: height,
                    cols: width,
                }],
                columns: 1,
                height,
                width,
                scale,
            };
        };
        let stride = ((side as f64 * (1.0 - OVERLAP)) as usize).max(1);
        let starts = |size: usize| (0..size).step_by(stride).collect::<Vec<_>>();
        let (rows, cols) = (starts(height), starts(width));
        let tiles = rows
            .iter()
            .flat_map(|&row| {
                cols.iter().map(move |&col| Tile {
                    row,
                    col,
                    rows: side.min(height - row),
                    cols: side.min(width - col),
                })
            })
            .collect();
        Self {
            tile: Some(side),
            tiles,
            columns: cols.len(),
            height,
            width,
            scale,
        }
    }

    /// The largest tile's latent positions.
    pub fn largest(&self) -> (usize, usize) {
        let rows = self.tiles.iter().map(|tile| tile.rows).max().unwrap_or(0);
        let cols = self.tiles.iter().map(|tile| tile.cols).max().unwrap_or(0);
        (rows, cols)
    }

    /// The image of decoded tiles (each `[channels, rows·scale, cols·scale]`, in tile
    /// order): blended and cropped as diffusers does, `[channels, height·scale,
    /// width·scale]`.
    pub fn assemble(&self, decoded: &[&[f32]], channels: usize) -> Vec<f32> {
        let scale = self.scale;
        let (height, width) = (self.height * scale, self.width * scale);
        let Some(side) = self.tile else {
            return decoded
                .first()
                .map(|image| image.to_vec())
                .unwrap_or_default();
        };
        let sample = side * scale;
        let blend = (sample as f64 * OVERLAP) as usize;
        let limit = sample - blend;
        let mut tiles: Vec<Vec<f32>> = decoded.iter().map(|tile| tile.to_vec()).collect();
        let size = |index: usize| {
            (
                self.tiles[index].rows * scale,
                self.tiles[index].cols * scale,
            )
        };
        for index in 0..tiles.len() {
            let (row, column) = (index / self.columns, index % self.columns);
            if row > 0 {
                let above = index - self.columns;
                blend_rows(
                    &mut tiles,
                    above,
                    index,
                    size(above),
                    size(index),
                    blend,
                    channels,
                );
            }
            if column > 0 {
                blend_cols(
                    &mut tiles,
                    index - 1,
                    index,
                    size(index - 1),
                    size(index),
                    blend,
                    channels,
                );
            }
        }
        let mut image = vec![0.0; channels * height * width];
        for (index, tile) in tiles.iter().enumerate() {
            let (tile_height, tile_width) = size(index);
            let (row, column) = (index / self.columns, index % self.columns);
            let (top, left) = (row * limit, column * limit);
            for channel in 0..channels {
                for y in 0..tile_height.min(limit) {
                    for x in 0..tile_width.min(limit) {
                        let (to_y, to_x) = (top + y, left + x);
                        if to_y < height && to_x < width {
                            image[(channel * height + to_y) * width + to_x] =
                                tile[(channel * tile_height + y) * tile_width + x];
                        }
                    }
                }
            }
        }
        image
    }
}

/// diffusers' `blend_v`: the first rows of tile `to` fade in from the last rows of
/// tile `from` (the blended values of `from`, as its loop leaves them).
fn blend_rows(
    tiles: &mut [Vec<f32>],
    from: usize,
    to: usize,
    (from_height, from_width): (usize, usize),
    (to_height, to_width): (usize, usize),
    blend: usize,
    channels: usize,
) {
    let extent = blend.min(from_height).min(to_height);
    let width = from_width.min(to_width);
    for channel in 0..channels {
        for y in 0..extent {
            let weight = y as f32 / extent as f32;
            for x in 0..width {
                let above = tiles[from]
                    [(channel * from_height + from_height - extent + y) * from_width + x];
                let value = &mut tiles[to][(channel * to_height + y) * to_width + x];
                *value = above * (1.0 - weight) + *value * weight;
            }
        }
    }
}

/// diffusers' `blend_h`: the first columns of tile `to` fade in from the last
/// columns of tile `from`.
fn blend_cols(
    tiles: &mut [Vec<f32>],
    from: usize,
    to: usize,
    (from_height, from_width): (usize, usize),
    (to_height, to_width): (usize, usize),
    blend: usize,
    channels: usize,
) {
    let extent = blend.min(from_width).min(to_width);
    let height = from_height.min(to_height);
    for channel in 0..channels {
        for y in 0..height {
            for x in 0..extent {
                let weight = x as f32 / extent as f32;
                let left =
                    tiles[from][(channel * from_height + y) * from_width + from_width - extent + x];
                let value = &mut tiles[to][(channel * to_height + y) * to_width + x];
                *value = left * (1.0 - weight) + *value * weight;
            }
        }
    }
}

/// Bytes a decode of a `rows × cols` latent holds live at its largest stage: per
/// resolution, a ResNet block's input, two tensors of its width and the widened
/// residual (or the upsampling's input, its doubled copy and the convolution's
/// output), the mid-block attention's input and q, k, v, context. (A convolution's
/// im2col bands and widened weight are the adapter's scratch, as a product's cast
/// buffer is, not the family's tensors.)
pub fn working_set_bytes(config: &VaeConfig, rows: usize, cols: usize) -> u64 {
    let top = *config.channels.last().unwrap_or(&config.latent_channels) as u64;
    let mut pixels = (rows * cols) as u64;
    let mut peak = pixels * (config.latent_channels as u64 + top);
    if config.mid_attention {
        peak = peak.max(6 * pixels * top);
    }
    let mut previous = top;
    let levels = config.channels.len();
    for (number, &out) in config.channels.iter().rev().enumerate() {
        let out = out as u64;
        let widest = previous.max(out);
        peak = peak.max(pixels * (previous + 2 * widest + out));
        if number + 1 < levels {
            peak = peak.max(pixels * out + 2 * (4 * pixels) * out);
            pixels *= 4;
        }
        previous = out;
    }
    let bottom = config.channels[0] as u64;
    let image = config.image_channels as u64;
    peak = peak.max(pixels * (2 * bottom + image));
    4 * peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_start_every_three_quarters_of_a_tile_and_stop_at_the_edge() {
        // Proves the cut diffusers makes: a 12 × 10 latent in tiles of 4 starts a tile
        // every 3 positions (0, 3, 6, 9), the last ones cut by the edge.
        let tiling = Tiling::new(12, 10, Some(4), 8);
        assert_eq!(tiling.columns, 4);
        assert_eq!(tiling.tiles.len(), 16);
        assert_eq!(
            tiling.tiles[15],
            Tile {
                row: 9,
                col: 9,
                rows: 3,
                cols: 1
            }
        );
        // A tile as large as the latent is no tiling.
        assert_eq!(Tiling::new(8, 6, Some(8), 8).tiles.len(), 1);
    }
}
