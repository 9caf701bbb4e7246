"""Methods (prvr.methods): backbones, relation detectors, objectives and named recipes.

Every module of this package and of its subpackages (backbones/, objectives/, relations/) is
imported here, in sorted order of names (harness/base/registry.py `import_modules`), so a new file
registers its parts by existing: no list of modules to edit. A module that fails to import
stops the import with its own error.
"""

from prvr.harness.base.registry import import_modules

import_modules(__name__)
