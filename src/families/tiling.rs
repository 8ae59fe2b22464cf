//! What the two autoencoders' tiled decodes share (diffusers' `AutoencoderKL` and
//! `AutoencoderKLWan.tiled_decode`): a latent cut into tiles that start every stride
//! and stop at the edge, and the decoded tiles blended into each other's seams
//! (`blend_v`, `blend_h`) and cropped. How far a seam blends and how much of a tile
//! is kept differ between the two (a quarter of the tile against the tile less the
//! stride), so each family says it in [`Seams`].

/// One tile: latent rows `row .. row + rows`, columns `col .. col + cols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    pub row: usize,
    pub col: usize,
    pub rows: usize,
    pub cols: usize,
}

/// The tiles of a latent, row of tiles after row of tiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    pub tiles: Vec<Tile>,
    /// Tiles per row of tiles.
    pub columns: usize,
}

impl Grid {
    /// A `height × width` latent in tiles of `tile` (rows, columns) starting every
    /// `stride` (rows, columns), as diffusers' `range(0, size, stride)` starts them:
    /// the last ones cut by the edge.
    pub fn new(height: usize, width: usize, tile: (usize, usize), stride: (usize, usize)) -> Self {
        let starts = |size: usize, stride: usize| (0..size).step_by(stride.max(1)).collect();
        let (rows, cols): (Vec<usize>, Vec<usize>) =
            (starts(height, stride.0), starts(width, stride.1));
        let tiles = rows
            .iter()
            .flat_map(|&row| {
                cols.iter().map(move |&col| Tile {
                    row,
                    col,
                    rows: tile.0.min(height - row),
                    cols: tile.1.min(width - col),
                })
            })
            .collect();
        Self {
            tiles,
            columns: cols.len(),
        }
    }

    /// One tile, the whole latent.
    pub fn whole(height: usize, width: usize) -> Self {
        Self {
            tiles: vec![Tile {
                row: 0,
                col: 0,
                rows: height,
                cols: width,
            }],
            columns: 1,
        }
    }

    /// The largest tile's latent rows and columns.
    pub fn largest(&self) -> (usize, usize) {
        let rows = self.tiles.iter().map(|tile| tile.rows).max().unwrap_or(0);
        let cols = self.tiles.iter().map(|tile| tile.cols).max().unwrap_or(0);
        (rows, cols)
    }
}

/// How decoded tiles meet, in pixels (rows, columns): how many of a tile's first
/// rows and columns fade in from its neighbours', and how many of its rows and
/// columns the image keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seams {
    pub blend: (usize, usize),
    pub keep: (usize, usize),
}

/// The image of decoded tiles (each `[planes, rows·scale, cols·scale]`, in the
/// grid's order; planes are channels, or channels × frames for a video), blended
/// as diffusers' loop does (each tile with the one above, then the one to its left,
/// as those were left blended) and cropped to `size` pixels (rows, columns).
pub fn blend_and_crop(
    grid: &Grid,
    mut tiles: Vec<Vec<f32>>,
    (scale, planes): (usize, usize),
    seams: Seams,
    (height, width): (usize, usize),
) -> Vec<f32> {
    let size = |index: usize| {
        let tile = grid.tiles[index];
        (tile.rows * scale, tile.cols * scale)
    };
    let columns = grid.columns.max(1);
    for index in 0..tiles.len().min(grid.tiles.len()) {
        let (row, column) = (index / columns, index % columns);
        if row > 0 {
            let above = index - columns;
            let sizes = (size(above), size(index));
            blend_rows(&mut tiles, (above, index), sizes, seams.blend.0, planes);
        }
        if column > 0 {
            let sizes = (size(index - 1), size(index));
            blend_cols(&mut tiles, (index - 1, index), sizes, seams.blend.1, planes);
        }
    }
    let mut image = vec![0.0; planes * height * width];
    for (index, tile) in tiles.iter().enumerate().take(grid.tiles.len()) {
        let (tile_height, tile_width) = size(index);
        let (row, column) = (index / columns, index % columns);
        let (top, left) = (row * seams.keep.0, column * seams.keep.1);
        for plane in 0..planes {
            for y in 0..tile_height.min(seams.keep.0) {
                for x in 0..tile_width.min(seams.keep.1) {
                    let (to_y, to_x) = (top + y, left + x);
                    if to_y < height && to_x < width {
                        image[(plane * height + to_y) * width + to_x] =
                            tile[(plane * tile_height + y) * tile_width + x];
                    }
                }
            }
        }
    }
    image
}

/// diffusers' `blend_v`: the first rows of tile `to` fade in from the last rows of
/// tile `from` (the blended values of `from`, as its loop leaves them).
fn blend_rows(
    tiles: &mut [Vec<f32>],
    (from, to): (usize, usize),
    ((from_height, from_width), (to_height, to_width)): ((usize, usize), (usize, usize)),
    blend: usize,
    planes: usize,
) {
    let extent = blend.min(from_height).min(to_height);
    let width = from_width.min(to_width);
    for plane in 0..planes {
        for y in 0..extent {
            let weight = y as f32 / extent as f32;
            for x in 0..width {
                let above =
                    tiles[from][(plane * from_height + from_height - extent + y) * from_width + x];
                let value = &mut tiles[to][(plane * to_height + y) * to_width + x];
                *value = above * (1.0 - weight) + *value * weight;
            }
        }
    }
}

/// diffusers' `blend_h`: the first columns of tile `to` fade in from the last
/// columns of tile `from`.
fn blend_cols(
    tiles: &mut [Vec<f32>],
    (from, to): (usize, usize),
    ((from_height, from_width), (to_height, to_width)): ((usize, usize), (usize, usize)),
    blend: usize,
    planes: usize,
) {
    let extent = blend.min(from_width).min(to_width);
    let height = from_height.min(to_height);
    for plane in 0..planes {
        for y in 0..height {
            for x in 0..extent {
                let weight = x as f32 / extent as f32;
                let left =
                    tiles[from][(plane * from_height + y) * from_width + from_width - extent + x];
                let value = &mut tiles[to][(plane * to_height + y) * to_width + x];
                *value = left * (1.0 - weight) + *value * weight;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seam_fades_from_the_tile_above_into_the_tile_below() {
        // Proves the blend's direction and weights: two tiles of one column, 4 rows
        // each, the second starting 2 rows down; over a seam of 2 rows the second
        // tile's first row is the first's row 2, its second row halfway between.
        let grid = Grid::new(6, 1, (4, 1), (2, 1));
        assert_eq!(grid.tiles.len(), 3);
        let tiles = vec![vec![0.0, 0.0, 1.0, 1.0], vec![3.0; 4], vec![5.0; 2]];
        let seams = Seams {
            blend: (2, 0),
            keep: (2, 1),
        };
        let image = blend_and_crop(&grid, tiles, (1, 1), seams, (6, 1));
        assert_eq!(image, [0.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
    }
}
