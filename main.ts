// The production entry point: `npm run build` compiles it to `dist/main.js`, beside `dist/src/` and `dist/migrations/`.
import "./src/main.js"
