# One image for docker-compose.yml's migrate, web, worker, beat and flower services.
# Written against the README's "Running it for real"; no Docker engine runs on the project's own
# machines, so tests/core/test_processes.py checks this file's shape, not a build.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ANNIHILATION_HOME=/data

# git: agents work in git worktrees and the Tether merges their branches. The repository is
# mounted from the host, owned by another user: git would refuse it as "dubious ownership".
RUN apt-get update \
    && apt-get install -y --no-install-recommends git bubblewrap \
    && rm -rf /var/lib/apt/lists/* \
    && git config --system safe.directory '*'

WORKDIR /app
COPY . .
# Editable, as `make install` does: templates, pipelines, roles and scripts are read from /app.
# collectstatic needs a key strong enough for DEBUG off, and none that outlives it.
RUN pip install --no-cache-dir -e . \
    && DEBUG=false SECRET_KEY="$(python -c 'import secrets; print(secrets.token_urlsafe(50))')" \
       python manage.py collectstatic --noinput -v 0

# Not root: UID should own the mounted repository (build with --build-arg UID=$(id -u)).
ARG UID=1000
RUN useradd --uid "$UID" --create-home annihilation \
    && mkdir -p /data && chown annihilation /data
USER annihilation
VOLUME /data
EXPOSE 8000 5555
