# syntax=docker/dockerfile:1
# nenas in production: compiled JavaScript on Node LTS, production dependencies only, as a non-root user.
# Build: docker build -t nenas .   Run: see compose.yaml (PostgreSQL, Redis, two instances behind Caddy).

# Pinned: a rebuild gets the same base until this line changes.
ARG NODE_IMAGE=node:22.21.1-bookworm-slim

# Compiles the service (and the dashboard) with every development dependency.
FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json main.ts ./
COPY src ./src
COPY migrations ./migrations
COPY web ./web
# No source maps in the image: the dashboard's would be served under /app/assets with its full sources.
RUN npm run build && find dist web/dist -name '*.map' -delete

# Production dependencies only: no tsx, no embedded PostgreSQL, no test tools.
FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force

FROM ${NODE_IMAGE}
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=8080
WORKDIR /app
COPY --chown=root:root package.json ./
COPY --from=deps --chown=root:root /app/node_modules ./node_modules
COPY --from=build --chown=root:root /app/dist ./dist
COPY --from=build --chown=root:root /app/web/dist ./web/dist
# The image's own unprivileged user; the application's files stay read-only to it.
USER node
EXPOSE 8080
# Ready = the process answers and its database does.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.PORT || 8080) + '/readyz').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# Exec form: node itself receives SIGTERM (no shell in between) and drains in-flight calls before it exits.
STOPSIGNAL SIGTERM
# The node flags of `npm run start:prod`: 32 MB semi-spaces and a 30% old-generation growth
# (docs/performance.md, "Memory: the young generation and the old one's growth").
CMD ["node", "--max-semi-space-size=32", "--heap-growing-percent=30", "dist/main.js"]
