"""Offline renderers for the "3dshapes-like" and "dSprites-like" files (datamodules/shapes.py).

These are *not* DeepMind's images: they reproduce the factor grids of 3dshapes (Burgess & Kim
2018) and dSprites (Matthey et al. 2017) exactly, with scenes drawn to look alike, so that the
pipeline ([S] Sec. 3.2, App. D) runs where the real files cannot be downloaded.

**3dshapes-like.** A floor (``y = 0``), a back wall (``z = WALL_Z``) and one object (cube,
cylinder, sphere, or a capsule lying along its x axis) resting on the floor at the origin,
seen by a pinhole camera that orbits the vertical axis by the orientation angle (so the
object's faces and the floor/wall edge both turn with it). The light is fixed in the scene:
Lambert shading plus ambient on the object, and a soft shadow of the object on the floor and
wall. The object is found by sphere tracing its signed distance; floor and wall are planes.

Geometry depends only on (scale, shape, orientation), colour only on the three hues, so each of
the ``8 * 4 * 15`` geometries is ray cast once, into per-pixel weights ``w[r]`` of the three
regions ``r`` (floor, wall, object: coverage of a pixel's sub-samples times the shading), and
an image is ``sum_r w[r] * rgb(hue_r)`` with ``rgb`` the HSV colour of full saturation and
value: exact anti-aliasing of a linear shading model, and cheap for 480,000 images.

**dSprites-like.** Binary images (0/1) of a square, an ellipse or a heart, polygons rotated by
the orientation, scaled, and centred at ``(posX, posY)``: pixel centres are tested for being
inside the polygon (even-odd rule). Pixel ``(row v, column u)``; posX moves the sprite along
columns, posY along rows (downward).
"""
from __future__ import annotations

import colorsys
import zlib

import numpy as np

# -- 3dshapes-like scene ------------------------------------------------------------------------------
RENDER_VERSION = 1  # bump when the pictures change: it is part of the cached file names
WALL_Z = 2.6  # back wall, behind the object as seen at orientation 0
CAM_DIST, CAM_HEIGHT, CAM_TARGET_Y, FOV_DEG = 4.3, 1.8, 0.6, 42.0
LIGHT = np.array([-0.45, 0.8, -0.4]) / np.linalg.norm([-0.45, 0.8, -0.4])  # towards the light
AMBIENT_OBJECT, AMBIENT_ROOM = 0.35, 0.55
SUPERSAMPLE = 3  # 3x3 sub-pixel rays per pixel
PENUMBRA = 1.0  # beyond this distance from the object the soft shadow (k = 8) is negligible


def _sdf(p: np.ndarray, shape: int, s: float) -> np.ndarray:
    """Signed distance to the object (local frame, origin at its centre) of size ``s``."""
    x, y, z = p[..., 0], p[..., 1], p[..., 2]
    if shape == 0:  # cube, side s
        q = np.abs(p) - 0.5 * s
        return np.linalg.norm(np.maximum(q, 0), axis=-1) + np.minimum(q.max(axis=-1), 0)
    if shape == 1:  # upright cylinder, diameter and height s
        dx, dy = np.hypot(x, z) - 0.5 * s, np.abs(y) - 0.5 * s
        return np.minimum(np.maximum(dx, dy), 0) + np.hypot(np.maximum(dx, 0), np.maximum(dy, 0))
    if shape == 2:  # sphere, diameter s
        return np.linalg.norm(p, axis=-1) - 0.5 * s
    if shape == 3:  # capsule lying along x: radius 0.33 s, straight part 0.75 s
        r, a = 0.33 * s, 0.375 * s
        return np.sqrt((x - np.clip(x, -a, a)) ** 2 + y ** 2 + z ** 2) - r
    raise ValueError(f"shape = {shape}; allowed: 0..3 (cube, cylinder, sphere, capsule)")


def _half_height(shape: int, s: float) -> float:
    return 0.33 * s if shape == 3 else 0.5 * s


def _bounding_entry(o: np.ndarray, d: np.ndarray, centre: np.ndarray, radius: float) -> np.ndarray:
    """Where unit rays enter the sphere (centre, radius): ``inf`` for rays that miss it, 0 inside."""
    oc = o - centre
    b = np.einsum("ij,ij->i", oc, d)
    disc = b * b - (np.einsum("ij,ij->i", oc, oc) - radius ** 2)
    with np.errstate(invalid="ignore"):
        t_far = -b + np.sqrt(disc)
    t_near = np.maximum(-b - np.sqrt(np.maximum(disc, 0)), 0)
    return np.where((disc > 0) & (t_far > 0), t_near, np.inf)


def _bounding_radius(shape: int, s: float) -> float:
    return {0: 0.5 * np.sqrt(3), 1: 0.5 * np.sqrt(2), 2: 0.5, 3: 0.375 + 0.33}[shape] * s * 1.01


def _trace(o: np.ndarray, d: np.ndarray, shape: int, s: float, centre: np.ndarray, t_max: np.ndarray,
           steps: int = 96) -> np.ndarray:
    """Distance along unit rays ``o + t d`` to the object, ``inf`` where missed (sphere tracing,
    started where a ray enters the object's bounding sphere; rays missing it are never marched)."""
    t = _bounding_entry(o, d, centre, _bounding_radius(shape, s))
    hit = np.zeros(o.shape[0], bool)
    live = np.isfinite(t) & (t < t_max)
    t = np.where(live, t, 0.0)
    for _ in range(steps):
        idx = np.nonzero(live)[0]
        if idx.size == 0:
            break
        dist = _sdf(o[idx] + t[idx, None] * d[idx] - centre, shape, s)
        near = dist < 1e-4
        hit[idx[near]] = True
        t[idx] += np.where(near, 0.0, dist)
        live[idx[near | (t[idx] > t_max[idx])]] = False
    return np.where(hit, t, np.inf)


def _soft_shadow(p: np.ndarray, shape: int, s: float, centre: np.ndarray, k: float = 8.0) -> np.ndarray:
    """Visibility of the light from points ``p`` (1 lit .. 0 in full shadow), a penumbra-softened
    march towards the light (min over the march of ``k * distance / t``)."""
    vis = np.ones(p.shape[0])
    # only points whose light ray passes within PENUMBRA of the object can be shaded by it
    near = np.nonzero(np.isfinite(_bounding_entry(p, np.broadcast_to(LIGHT, p.shape), centre,
                                                  _bounding_radius(shape, s) + PENUMBRA)))[0]
    q, v = p[near], vis[near]
    t = np.full(near.size, 0.02)
    for _ in range(48):
        dist = _sdf(q + t[:, None] * LIGHT - centre, shape, s)
        v = np.minimum(v, np.clip(k * dist / t, 0, 1))
        t += np.clip(dist, 0.02, 0.5)
    vis[near] = v
    return vis


def render_geometry(scale: float, shape: int, orientation_deg: float, resolution: int) -> np.ndarray:
    """Per-pixel weights (3, res, res) float32 of floor, wall and object (coverage x shading)."""
    n = resolution * SUPERSAMPLE
    th = np.deg2rad(orientation_deg)
    # camera orbiting the vertical axis by the orientation: position and orthonormal frame
    cam = np.array([CAM_DIST * np.sin(th), CAM_HEIGHT, -CAM_DIST * np.cos(th)])
    fwd = np.array([0.0, CAM_TARGET_Y, 0.0]) - cam
    fwd /= np.linalg.norm(fwd)
    right = np.cross([0.0, 1.0, 0.0], fwd)
    right /= np.linalg.norm(right)
    up = np.cross(fwd, right)
    half = np.tan(np.deg2rad(FOV_DEG) / 2)
    c = (np.arange(n) + 0.5) / n * 2 - 1  # sub-pixel centres in [-1, 1]
    u, v = np.meshgrid(c * half, -c * half)  # image row 0 at the top
    d = fwd + u[..., None] * right + v[..., None] * up
    d = (d / np.linalg.norm(d, axis=-1, keepdims=True)).reshape(-1, 3)
    o = np.broadcast_to(cam, d.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_floor = np.where(d[:, 1] < 0, -cam[1] / d[:, 1], np.inf)
        t_wall = np.where(d[:, 2] > 0, (WALL_Z - cam[2]) / d[:, 2], np.inf)
    centre = np.array([0.0, _half_height(shape, scale), 0.0])
    t_room = np.minimum(t_floor, t_wall)
    t_obj = _trace(o, d, shape, scale, centre, np.minimum(t_room, 2 * CAM_DIST))
    region = np.where(t_obj < t_room, 2, np.where(t_floor <= t_wall, 0, 1))
    shade = np.zeros(d.shape[0])
    # object: Lambert with the normal from the distance field's gradient
    io = np.nonzero(region == 2)[0]
    if io.size:
        p = o[io] + t_obj[io, None] * d[io]
        e = 1e-3
        grad = np.stack([_sdf(p + e * ax - centre, shape, scale) - _sdf(p - e * ax - centre, shape, scale)
                         for ax in np.eye(3)], axis=-1)
        nrm = grad / np.linalg.norm(grad, axis=-1, keepdims=True)
        shade[io] = AMBIENT_OBJECT + (1 - AMBIENT_OBJECT) * np.clip(nrm @ LIGHT, 0, 1)
    # floor and wall: flat light, darkened in the object's shadow
    ir = np.nonzero(region < 2)[0]
    if ir.size:
        p = o[ir] + t_room[ir, None] * d[ir]
        vis = _soft_shadow(p, shape, scale, centre)
        lambert = np.where(region[ir] == 0, LIGHT[1], -LIGHT[2])  # floor normal +y, wall normal -z
        shade[ir] = AMBIENT_ROOM + (1 - AMBIENT_ROOM) * lambert * vis
    w = np.zeros((3, d.shape[0]))
    w[region, np.arange(d.shape[0])] = shade
    w = w.reshape(3, resolution, SUPERSAMPLE, resolution, SUPERSAMPLE).mean(axis=(2, 4))
    return w.astype(np.float32)


def hue_rgb(hue: float) -> np.ndarray:
    """The colour of a hue at full saturation and value."""
    return np.array(colorsys.hsv_to_rgb(float(hue) % 1.0, 1.0, 1.0), dtype=np.float32)


def colourise(weights: np.ndarray, floor_rgb: np.ndarray, wall_rgb: np.ndarray,
              object_rgb: np.ndarray) -> np.ndarray:
    """Images (n_obj, n_geo, H, W, 3) uint8 from weights (n_geo, 3, H, W) and colours (3,), (3,),
    (n_obj, 3): ``sum_r w[r] * rgb_r``."""
    room = weights[:, 0, ..., None] * floor_rgb + weights[:, 1, ..., None] * wall_rgb  # (G, H, W, 3)
    img = room[None] + weights[None, :, 2, ..., None] * object_rgb[:, None, None, None, :]
    return np.clip(np.rint(img * 255), 0, 255).astype(np.uint8)


def deflate_chunks(images: np.ndarray, rows: int, level: int = 4) -> list[bytes]:
    """``images`` split into blocks of ``rows`` images, each zlib-compressed as HDF5's deflate
    filter stores a chunk (so the parent writes them with ``write_direct_chunk``)."""
    return [zlib.compress(np.ascontiguousarray(images[i:i + rows]).tobytes(), level)
            for i in range(0, images.shape[0], rows)]


# -- dSprites-like sprites ------------------------------------------------------------------------------
SPRITE_HALF_SIZE = 0.1  # half the side of the square at scale 1, in units of the image width
POSITION_SPAN = 46.5 / 64  # sprite centres span this fraction of the image (1.5 px steps at 64 px)


def sprite_polygon(shape: int) -> np.ndarray:
    """Vertices (m, 2) of shape 0 square, 1 ellipse, 2 heart, in units of the half-size, centred."""
    if shape == 0:
        return np.array([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])
    t = np.linspace(0, 2 * np.pi, 72, endpoint=False)
    if shape == 1:
        return np.stack([1.25 * np.cos(t), 0.62 * np.sin(t)], axis=1)
    if shape == 2:  # the classic heart curve, point downward (rows grow downward), scaled to ~[-1.2, 1.2]
        x = 16 * np.sin(t) ** 3
        y = 13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t)
        xy = np.stack([x, -(y - 2.5)], axis=1)
        return xy * (1.2 / np.abs(xy).max())
    raise ValueError(f"shape = {shape}; allowed: 0..2 (square, ellipse, heart)")


def _inside(px: np.ndarray, py: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """Even-odd point-in-polygon test of points (px, py) (same shape) against vertices (m, 2)."""
    inside = np.zeros(px.shape, bool)
    x0, y0 = poly[:, 0], poly[:, 1]
    x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
    for a, b, c, e in zip(x0, y0, x1, y1):
        crosses = (b > py) != (e > py)
        with np.errstate(divide="ignore", invalid="ignore"):
            xc = a + (py - b) * (c - a) / (e - b)
        inside ^= crosses & (px < xc)
    return inside


def render_sprites(shape: int, scale: float, orientation: float, pos_x: np.ndarray, pos_y: np.ndarray,
                   resolution: int) -> np.ndarray:
    """Binary images (len(pos_x), len(pos_y), res, res) uint8 of one sprite at every position.

    The mask depends on position only through the offsets ``pixel centre - sprite centre``; they
    are tested once per distinct value on each axis and the images gathered from that table.
    """
    poly = sprite_polygon(shape) * SPRITE_HALF_SIZE * scale
    rot = np.array([[np.cos(orientation), -np.sin(orientation)], [np.sin(orientation), np.cos(orientation)]])
    poly = poly @ rot.T
    pix = (np.arange(resolution) + 0.5) / resolution
    cx = 0.5 + (np.asarray(pos_x, float) - 0.5) * POSITION_SPAN
    cy = 0.5 + (np.asarray(pos_y, float) - 0.5) * POSITION_SPAN
    # distinct offsets per axis (rounded so that equal offsets computed differently coincide)
    ox, ix = np.unique(np.round(pix[None, :] - cx[:, None], 9), return_inverse=True)
    oy, iy = np.unique(np.round(pix[None, :] - cy[:, None], 9), return_inverse=True)
    ix, iy = ix.reshape(len(cx), resolution), iy.reshape(len(cy), resolution)
    gy, gx = np.meshgrid(oy, ox, indexing="ij")
    table = _inside(gx, gy, poly).astype(np.uint8)  # (offset y, offset x)
    # image[i, j, v, u] = table[iy[j, v], ix[i, u]]
    return table[iy[None, :, :, None], ix[:, None, None, :]]
