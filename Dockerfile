# One image for docker-compose.yml's migrate, web, worker, beat and flower services.
# Written against the README's "Running it for real"; no Docker engine runs on the project's own
# machines, so tests/core/test_processes.py checks this file's shape, not a build.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ANNIHILATION_HOME=/data

# git: agents work in git worktrees and the Tether merges their branches; the compose file's
# `git` service serves the central repository. The repository it is seeded from is mounted from
# the host, owned by another user: git would refuse it as "dubious ownership".
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

# Not root: UID should be able to read the repository mounted as the seed (build with
# --build-arg UID=$(id -u)). /srv/git: the central repository's volume, which a new named
# volume takes with its owner from the image.
ARG UID=1000
RUN useradd --uid "$UID" --create-home annihilation \
    && mkdir -p /data /srv/git && chown annihilation /data /srv/git
USER annihilation
VOLUME /data
EXPOSE 8000 5555
