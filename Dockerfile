# radixcache's image: exactly requirements.lock, installed as `make install` does, run as a
# non-root user. torch's CPU build is not on PyPI's index: put its wheel (the one the lock pins,
# /opt/wheels on machines of this kind) in wheels/ beside this file before building:
#   mkdir -p wheels && cp /opt/wheels/torch-*.whl wheels/ && docker build -t radixcache:latest .
FROM python:3.11-slim-bookworm

RUN apt-get update && apt-get install -y --no-install-recommends make g++ \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 radixcache

WORKDIR /opt/radixcache
COPY wheels/ /opt/wheels/
COPY Makefile pyproject.toml requirements.lock README.md ./
COPY radixcache/ radixcache/
COPY engine/ engine/
COPY storage/ storage/
COPY api/ api/
RUN make install VENV=/opt/radixcache/.venv && rm -rf /root/.cache
ENV PATH=/opt/radixcache/.venv/bin:$PATH RADIXCACHE_HOME=/data
RUN mkdir -p /data && chown radixcache:radixcache /data

USER 10001
EXPOSE 8000 5557 5558
ENTRYPOINT ["radixcache"]
CMD ["serve", "--host=0.0.0.0"]
