"""methods/backbones"""

from prvr.methods.backbones import gmmformer, gmmformer2, msl  # noqa: F401  (importing registers them)
from prvr.methods.backbones import arl  # noqa: F401
