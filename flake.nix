{
  description = "nenas: model-routing API with prepaid billing in Malaysian ringgit (development shell)";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" "x86_64-darwin" "aarch64-darwin" ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          packages = [
            # Node 22 LTS (the service also runs on Node 20: package.json "engines").
            pkgs.nodejs_22
            # PostgreSQL 18, the embedded version, for a local server at DATABASE_URL; `npm start` embeds its own otherwise.
            pkgs.postgresql_18
            # The rate-limit tests use Redis at 127.0.0.1:6379 (`redis-server --daemonize yes`); REDIS_URL for several instances.
            pkgs.redis
          ];

          shellHook = ''
            echo "nenas development shell: node $(node --version), $(postgres --version)"
            echo "  npm install && npm start   # serves http://127.0.0.1:8080 (docs at /docs)"
            echo "  npm test                   # runs the test suite"
          '';
        };
      });
    };
}
