"""Inception-V3 and ResNet-50, written here from their papers (no torchvision, no weights).

Every layer count and channel width is scaled by ``width`` (1 = the paper); ``small`` configs use a
narrow, shallow version so tests trace in a fraction of a second.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["InceptionV3", "ResNet50"]


def _c(ch: int, width: float) -> int:
    return max(1, int(round(ch * width)))


class ConvBN(nn.Module):
    """conv (no bias) -> batch norm -> ReLU, the unit both papers build from."""

    def __init__(self, cin, cout, kernel, stride=1, padding=0, relu=True, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=eps)
        self.relu = relu

    def forward(self, x):
        x = self.bn(self.conv(x))
        return torch.relu(x) if self.relu else x


# ----------------------------------------------------------------------------------- ResNet-50
class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4), plus a projection shortcut where the shape changes
    (He et al. 2016, Fig. 5 right; stride on the 3x3 as in most implementations)."""

    def __init__(self, cin, mid, stride):
        super().__init__()
        self.a = ConvBN(cin, mid, 1)
        self.b = ConvBN(mid, mid, 3, stride=stride, padding=1)
        self.c = ConvBN(mid, mid * 4, 1, relu=False)
        self.short = ConvBN(cin, mid * 4, 1, stride=stride, relu=False) if stride != 1 or cin != mid * 4 else None

    def forward(self, x):
        s = x if self.short is None else self.short(x)
        return torch.relu(self.c(self.b(self.a(x))) + s)


class ResNet50(nn.Module):
    """ResNet-50: He et al., "Deep Residual Learning for Image Recognition", CVPR 2016, Table 1
    (stages of 3, 4, 6, 3 bottleneck blocks, widths 64..512 expanded x4, 1000 classes)."""

    def __init__(self, blocks=(3, 4, 6, 3), width=1.0, classes=1000):
        super().__init__()
        self.stem = ConvBN(3, _c(64, width), 7, stride=2, padding=3)
        layers, cin = [], _c(64, width)
        for i, n in enumerate(blocks):
            mid = _c(64 * 2**i, width)
            for j in range(n):
                layers.append(Bottleneck(cin, mid, 2 if j == 0 and i > 0 else 1))
                cin = mid * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(self.stem(x), 3, stride=2, padding=1)
        x = self.layers(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


# ----------------------------------------------------------------------------------- Inception-V3
class _Branches(nn.Module):
    """Parallel branches (each a sequence of ConvBN or pool) concatenated on channels."""

    def __init__(self, branches):
        super().__init__()
        self.branches = nn.ModuleList(nn.Sequential(*b) for b in branches)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], 1)


class _Pool(nn.Module):
    def __init__(self, kind, stride=1):
        super().__init__()
        self.kind, self.stride = kind, stride

    def forward(self, x):
        if self.kind == "avg":
            return nn.functional.avg_pool2d(x, 3, stride=self.stride, padding=1)
        return nn.functional.max_pool2d(x, 3, stride=self.stride)


def _conv(cin, cout, k, stride=1, pad=0):
    return ConvBN(cin, cout, k, stride=stride, padding=pad, eps=1e-3)


def _block_a(cin, pool, w):  # 35x35 (Szegedy et al. 2016, Fig. 5)
    c = lambda n: _c(n, w)  # noqa: E731
    return _Branches(
        [
            [_conv(cin, c(64), 1)],
            [_conv(cin, c(48), 1), _conv(c(48), c(64), 5, pad=2)],
            [_conv(cin, c(64), 1), _conv(c(64), c(96), 3, pad=1), _conv(c(96), c(96), 3, pad=1)],
            [_Pool("avg"), _conv(cin, c(pool), 1)],
        ]
    ), c(64) + c(64) + c(96) + c(pool)


def _reduce_a(cin, w):  # 35 -> 17 (Fig. 10)
    c = lambda n: _c(n, w)  # noqa: E731
    return _Branches(
        [
            [_conv(cin, c(384), 3, stride=2)],
            [_conv(cin, c(64), 1), _conv(c(64), c(96), 3, pad=1), _conv(c(96), c(96), 3, stride=2)],
            [_Pool("max", 2)],
        ]
    ), c(384) + c(96) + cin


def _block_c(cin, c7, w):  # 17x17, factorised 7x7 (Fig. 6)
    c = lambda n: _c(n, w)  # noqa: E731
    k17, k71 = (1, 7), (7, 1)
    p17, p71 = (0, 3), (3, 0)
    return _Branches(
        [
            [_conv(cin, c(192), 1)],
            [_conv(cin, c(c7), 1), _conv(c(c7), c(c7), k17, pad=p17), _conv(c(c7), c(192), k71, pad=p71)],
            [
                _conv(cin, c(c7), 1),
                _conv(c(c7), c(c7), k71, pad=p71),
                _conv(c(c7), c(c7), k17, pad=p17),
                _conv(c(c7), c(c7), k71, pad=p71),
                _conv(c(c7), c(192), k17, pad=p17),
            ],
            [_Pool("avg"), _conv(cin, c(192), 1)],
        ]
    ), 4 * c(192)


def _reduce_b(cin, w):  # 17 -> 8
    c = lambda n: _c(n, w)  # noqa: E731
    return _Branches(
        [
            [_conv(cin, c(192), 1), _conv(c(192), c(320), 3, stride=2)],
            [
                _conv(cin, c(192), 1),
                _conv(c(192), c(192), (1, 7), pad=(0, 3)),
                _conv(c(192), c(192), (7, 1), pad=(3, 0)),
                _conv(c(192), c(192), 3, stride=2),
            ],
            [_Pool("max", 2)],
        ]
    ), c(320) + c(192) + cin


class _BlockE(nn.Module):
    """8x8 block with expanded filter banks (Fig. 7): 1x3 and 3x1 side by side."""

    def __init__(self, cin, w):
        super().__init__()
        c = lambda n: _c(n, w)  # noqa: E731
        self.b1 = _conv(cin, c(320), 1)
        self.b3 = _conv(cin, c(384), 1)
        self.b3a, self.b3b = (
            _conv(c(384), c(384), (1, 3), pad=(0, 1)),
            _conv(c(384), c(384), (3, 1), pad=(1, 0)),
        )
        self.d1, self.d2 = _conv(cin, c(448), 1), _conv(c(448), c(384), 3, pad=1)
        self.d3a, self.d3b = (
            _conv(c(384), c(384), (1, 3), pad=(0, 1)),
            _conv(c(384), c(384), (3, 1), pad=(1, 0)),
        )
        self.pool = _conv(cin, c(192), 1)
        self.out = c(320) + 4 * c(384) + c(192)

    def forward(self, x):
        b3 = self.b3(x)
        d = self.d2(self.d1(x))
        p = self.pool(nn.functional.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.b1(x), self.b3a(b3), self.b3b(b3), self.d3a(d), self.d3b(d), p], 1)


class InceptionV3(nn.Module):
    """Inception-V3: Szegedy et al., "Rethinking the Inception Architecture for Computer Vision",
    CVPR 2016, Table 1 and Figs. 5-7, 10 (filter counts as in the authors' released TF-slim model).
    Not included: the auxiliary classifier and label smoothing (they add little compute)."""

    def __init__(self, width=1.0, classes=1000):
        super().__init__()
        c = lambda n: _c(n, width)  # noqa: E731
        self.stem = nn.Sequential(
            _conv(3, c(32), 3, stride=2),
            _conv(c(32), c(32), 3),
            _conv(c(32), c(64), 3, pad=1),
            _Pool("max", 2),
            _conv(c(64), c(80), 1),
            _conv(c(80), c(192), 3),
            _Pool("max", 2),
        )
        blocks, cin = [], c(192)
        for make in (
            lambda ci: _block_a(ci, 32, width),
            lambda ci: _block_a(ci, 64, width),
            lambda ci: _block_a(ci, 64, width),
            lambda ci: _reduce_a(ci, width),
            lambda ci: _block_c(ci, 128, width),
            lambda ci: _block_c(ci, 160, width),
            lambda ci: _block_c(ci, 160, width),
            lambda ci: _block_c(ci, 192, width),
            lambda ci: _reduce_b(ci, width),
        ):
            block, cin = make(cin)
            blocks.append(block)
        for _ in range(2):
            e = _BlockE(cin, width)
            blocks.append(e)
            cin = e.out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        x = nn.functional.dropout(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1), 0.2, self.training)
        return self.fc(x)
