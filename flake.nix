{
  description = "nenas: model-routing API with prepaid billing in Malaysian ringgit (development shell)";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.05";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" "x86_64-darwin" "aarch64-darwin" ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          packages = [
            pkgs.nodejs_20
            # For a local server at DATABASE_URL; `npm start` embeds its own PostgreSQL otherwise.
            pkgs.postgresql_16
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
