from setuptools import find_packages, setup

# torch is pinned in README/.ci to 2.13.0 *before* this install: an unpinned resolve would pull
# the CUDA build (GBs). The range here is satisfied by that CPU wheel, so pip installs nothing more.
setup(
    name="nmt",
    version="0.1.0",
    description="Fast, reliable neural machine translation training (fairseq-style)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["nmt", "nmt.*"]) + ["nmt_cli"],
    package_dir={"nmt_cli": "cli"},
    install_requires=[
        "torch>=2.4",
        "numpy>=1.24",
        "sentencepiece>=0.2",
        "sacrebleu>=2.3",
        "tensorboard>=2.12",
        "tqdm>=4.60",
    ],
    package_data={"nmt.deploy": ["static/*.html"]},
    extras_require={
        "xformers": ["xformers>=0.0.28"],
        # nmt-export / CTranslate2 inference (nmt-eval --path DIR, nmt-serve --path DIR)
        "ct2": ["ctranslate2>=4.5,<5"],
        # nmt-serve: Starlette (ASGI routes, no pydantic layer we would not use) on uvicorn
        "serve": ["starlette>=0.37", "uvicorn>=0.30"],
        # selenium drives Debian's chromium (apt) in the web page test
        "test": ["pytest>=7", "hypothesis>=6", "selenium>=4.20"],
    },
    entry_points={
        "console_scripts": [
            "nmt-preprocess=nmt_cli.preprocess:main",
            "nmt-train=nmt_cli.train:main",
            "nmt-eval=nmt_cli.eval:main",
            "nmt-export=nmt_cli.export:main",
            "nmt-serve=nmt_cli.serve:main",
        ]
    },
)
