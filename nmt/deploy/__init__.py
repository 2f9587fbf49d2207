"""Deployment: export to CTranslate2 (``nmt.deploy.ct2``) and the translation service (``nmt.deploy.serve``).

Imported by ``cli`` only; it may import ``eval``, ``model``, ``data`` and ``config``. The reading side
of an export (the model a Translator decodes with) lives in ``nmt.eval.ct2_model``, so that
``Translator.from_checkpoint(DIR)`` works without ``eval`` importing this package.
"""
