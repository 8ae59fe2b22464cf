//! Decoding in tiles of space, as diffusers' `AutoencoderKLWan.tiled_decode` does once
//! `enable_tiling` is called and the latent is wider or taller than a tile: the
//! latent is cut into tiles of `tile_sample_min_{height,width} / 8` positions
//! starting every `tile_sample_stride_{height,width} / 8`, each tile is decoded over
//! every frame with a feature cache of its own (`clear_cache` per tile), then each
//! decoded tile is blended into the one above and the one to its left over the tile
//! less the stride (in pixels), cropped to the stride, and the video cropped to its
//! size and clamped. A tile's working set is that of a decode of its size, whatever
//! the frame's, so a 720p video decodes within the budget of a tile.

use crate::families::tiling::{blend_and_crop, Grid, Seams};
use crate::families::FamilyError;

/// A tile and its stride in latent positions (diffusers names them in pixels:
/// `tile_sample_min_height = 8 · height`, `tile_sample_stride_height = 8 ·
/// stride_height`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WanTile {
    pub height: usize,
    pub width: usize,
    pub stride_height: usize,
    pub stride_width: usize,
}

impl WanTile {
    /// diffusers' defaults: tiles of 256 pixels every 192 (32 latent positions
    /// every 24).
    pub const DIFFUSERS: Self = Self::square(32);

    /// A square of `side` latent positions at diffusers' ratio of stride to tile
    /// (3 / 4), as `image --vae-tile` cuts the Flux VAE's.
    pub const fn square(side: usize) -> Self {
        let stride = if side * 3 / 4 == 0 { 1 } else { side * 3 / 4 };
        Self {
            height: side,
            width: side,
            stride_height: stride,
            stride_width: stride,
        }
    }

    /// A tile that cuts anything: positive sides, strides no longer than the sides
    /// (a longer stride would leave latent rows no tile decodes).
    pub fn check(&self) -> Result<(), FamilyError> {
        let sides = [
            self.height,
            self.width,
            self.stride_height,
            self.stride_width,
        ];
        if sides.contains(&0) || self.stride_height > self.height || self.stride_width > self.width
        {
            return Err(FamilyError::request("tile", format!(
                "a WAN VAE tile of {}×{} latent positions every {}×{}: tiles and strides must be positive and a stride no longer than its tile",
                self.height, self.width, self.stride_height, self.stride_width
            )));
        }
        Ok(())
    }
}

/// How a latent video of `height × width` positions is cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WanTiling {
    /// `None`: one tile, the whole frame (no tiling asked, or the latent fits one).
    pub tile: Option<WanTile>,
    pub grid: Grid,
    pub height: usize,
    pub width: usize,
    /// Pixels per latent position.
    pub scale: usize,
}

impl WanTiling {
    /// The tiles of a `height × width` latent; one (the whole frame) unless `tile`
    /// is smaller than the latent in one direction, as diffusers' `_decode` chooses.
    pub fn new(height: usize, width: usize, tile: Option<WanTile>, scale: usize) -> Self {
        let tile = tile.filter(|tile| height > tile.height || width > tile.width);
        let grid = match tile {
            Some(tile) => Grid::new(
                height,
                width,
                (tile.height, tile.width),
                (tile.stride_height, tile.stride_width),
            ),
            None => Grid::whole(height, width),
        };
        Self {
            tile,
            grid,
            height,
            width,
            scale,
        }
    }

    /// Tiles a frame is cut into.
    pub fn count(&self) -> usize {
        self.grid.tiles.len()
    }

    /// One video `[channels, frames, 8·height, 8·width]` of its tiles' decodes (each
    /// `[channels, frames, 8·rows, 8·cols]`, unclamped, in the grid's order),
    /// blended, cropped and clamped as `tiled_decode` does.
    pub fn assemble(&self, tiles: Vec<Vec<f32>>, (channels, frames): (usize, usize)) -> Vec<f32> {
        let Some(tile) = self.tile else {
            return tiles.into_iter().next().unwrap_or_default();
        };
        let scale = self.scale;
        let seams = Seams {
            blend: (
                scale * (tile.height - tile.stride_height),
                scale * (tile.width - tile.stride_width),
            ),
            keep: (scale * tile.stride_height, scale * tile.stride_width),
        };
        // A frame of a channel is a plane: the blend is the same on each.
        let planes = channels * frames;
        let size = (scale * self.height, scale * self.width);
        let mut video = blend_and_crop(&self.grid, tiles, (scale, planes), seams, size);
        for value in &mut video {
            *value = value.clamp(-1.0, 1.0);
        }
        video
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tile_is_cut_where_diffusers_cuts_it() {
        // Proves the cut of tiled_decode: a 6 × 7 latent in tiles of 4 every 3 starts
        // rows at 0 and 3 and columns at 0, 3 and 6, the last ones cut by the edge;
        // a latent no larger than the tile is one tile, and a stride longer than its
        // tile is refused.
        let tiling = WanTiling::new(6, 7, Some(WanTile::square(4)), 8);
        assert_eq!((tiling.count(), tiling.grid.columns), (6, 3));
        assert_eq!(tiling.grid.tiles[5].rows, 3);
        assert_eq!(tiling.grid.tiles[5].cols, 1);
        assert_eq!(WanTiling::new(4, 4, Some(WanTile::square(4)), 8).count(), 1);
        assert_eq!(WanTile::DIFFUSERS.stride_height, 24);
        let long = WanTile {
            stride_width: 5,
            ..WanTile::square(4)
        };
        assert!(long.check().is_err());
        assert!(WanTile::square(1).check().is_ok());
    }

    #[test]
    fn tiles_are_blended_before_the_clamp() {
        // Proves the order tiled_decode keeps: the tiles' unclamped values blend, then
        // the video is clamped. One row of 4 positions in tiles of 3 every 1 (seams of
        // 2): clamping first would give the third pixel 0, blending first gives 1.
        let tile = WanTile {
            height: 1,
            width: 3,
            stride_height: 1,
            stride_width: 1,
        };
        let tiling = WanTiling::new(1, 4, Some(tile), 1);
        let tiles = vec![vec![3.0; 3], vec![-1.0; 3], vec![-1.0; 2], vec![-1.0]];
        assert_eq!(tiling.assemble(tiles, (1, 1)), [1.0, 1.0, 1.0, -1.0]);
    }
}
