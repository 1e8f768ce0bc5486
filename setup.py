"""Packaging for mlperf-tf: the library, the built-in benchmarks and the compliance tools."""

from setuptools import find_packages, setup

setup(
    name="mlperf-tf",
    version="0.1.0",
    description="MLPerf-style training benchmarks for TensorFlow 2 / Keras 3",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(
        include=[
            "mlperf_tf",
            "mlperf_tf.*",
            "benchmarks",
            "benchmarks.*",
            "compliance",
            "compliance.*",
        ]
    ),
    # The simulator's committed data (FLOPs cache, published points, system files).
    package_data={"mlperf_tf.simulate": ["data/*.json", "systems/*.json", "systems/*.yaml"]},
    install_requires=[
        "tensorflow==2.20.*",
        "keras>=3.10,<4",
        "absl-py>=2.1",
        "mlperf-logging==4.1.68",
        "ml-collections>=1.0",
        "numpy>=1.26",
        "pycocotools>=2.0.8",
        "sacrebleu>=2.4",
        "sentencepiece>=0.2",
        "tokenizers>=0.15",  # the Llama 3.1 tokenizer.json (llama31_8b prepare)
        "scikit-learn>=1.4",
        "matplotlib>=3.8",
        "pyyaml>=6.0",
        "pillow>=10",
        "safetensors>=0.4",  # checkpoints: the suite's own and imported Hugging Face shards
        "jinja2>=3.1",  # qwen35_397b_grpo: the reference's prompt templates (NeMo Gym's .j2)
        "pyarrow>=14,<21",  # (21+ needs NumPy 2; the peers pin 1.26) parquet: MLCommons' preprocessed GovReport and FLUX embeddings
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "ruff==0.17.6"],
        "peers": ["tf-models-official==2.20.*", "keras-hub>=0.32", "keras-rs>=0.4"],
    },
    entry_points={
        "console_scripts": ["mlperf-tf = mlperf_tf.cli:run_main"],
        # The built-in benchmarks register like any third-party package (mlperf_tf/registry.py).
        "mlperf_tf.benchmarks": [
            "bert = benchmarks.bert.benchmark:BertBenchmark",
            "dlrmv4 = benchmarks.dlrmv4.benchmark:DlrmV4Benchmark",
            "deepseekv3_671b = benchmarks.deepseekv3_671b.benchmark:DeepseekV3Benchmark",
            "flux1 = benchmarks.flux1.benchmark:FluxBenchmark",
            "gpt_oss_20b = benchmarks.gpt_oss_20b.benchmark:GptOssBenchmark",
            "llama2_70b_lora = benchmarks.llama2_70b_lora.benchmark:LoraBenchmark",
            "llama31_8b = benchmarks.llama31_8b.benchmark:Llama31Benchmark",
            "qwen35_397b_grpo = benchmarks.qwen35_397b_grpo.benchmark:Qwen35GrpoBenchmark",
            "resnet50 = benchmarks.resnet50.benchmark:ResNet50Benchmark",
            "ssd = benchmarks.ssd.benchmark:SSDBenchmark",
            "transformer = benchmarks.transformer.benchmark:TransformerBenchmark",
        ],
        # Optimizer plug-ins (mlperf_tf/optimizers/registry.py); third-party packages add theirs.
        "mlperf_tf.optimizers": [
            "sgd = mlperf_tf.optimizers.plugins:SGD",
            "lars = mlperf_tf.optimizers.plugins:LARS_PLUGIN",
            "lamb = mlperf_tf.optimizers.plugins:LAMB_PLUGIN",
            "adam = mlperf_tf.optimizers.plugins:ADAM",
            "adamw = mlperf_tf.optimizers.plugins:ADAMW",
            "neumann = mlperf_tf.optimizers.neumann:PLUGIN",
            "nlcg = mlperf_tf.optimizers.nlcg:PLUGIN",
            "kfac = mlperf_tf.optimizers.kfac:PLUGIN",
        ],
    },
)
