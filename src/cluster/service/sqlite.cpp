#include "cluster/service/sqlite.h"

#include "core/error.h"

namespace loom::service {

Database::Database(std::string path) : path_(std::move(path)) {
  if (sqlite3_open_v2(path_.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string message = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error(path_ + ": cannot open the job store: " + message);
  }
  sqlite3_busy_timeout(db_, 10000);
  execute("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;");
}

Database::~Database() {
  sqlite3_close_v2(db_);
}

void Database::fail(const std::string& what) const {
  throw Error(path_ + ": " + what + ": " + sqlite3_errmsg(db_));
}

void Database::execute(std::string_view sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, std::string(sql).c_str(), nullptr, nullptr, &message) != SQLITE_OK) {
    std::string text = message ? message : "unknown error";
    sqlite3_free(message);
    throw Error(path_ + ": " + text + " (in: " + std::string(sql.substr(0, 80)) + ")");
  }
}

std::int64_t Database::last_insert_id() const {
  return sqlite3_last_insert_rowid(db_);
}

int Database::changes() const {
  return sqlite3_changes(db_);
}

int Database::user_version() {
  Statement s(*this, "PRAGMA user_version");
  s.step();
  return static_cast<int>(s.integer(0));
}

Statement::Statement(Database& db, std::string_view sql) : db_(db) {
  if (sqlite3_prepare_v2(db.handle(), sql.data(), static_cast<int>(sql.size()), &statement_,
                         nullptr) != SQLITE_OK)
    db.fail("cannot prepare '" + std::string(sql.substr(0, 60)) + "'");
}

Statement::~Statement() {
  sqlite3_finalize(statement_);
}

Statement& Statement::bind(int index, std::int64_t value) {
  if (sqlite3_bind_int64(statement_, index, value) != SQLITE_OK)
    db_.fail("bind");
  return *this;
}
Statement& Statement::bind(int index, double value) {
  if (sqlite3_bind_double(statement_, index, value) != SQLITE_OK)
    db_.fail("bind");
  return *this;
}
Statement& Statement::bind(int index, std::string_view value) {
  if (sqlite3_bind_text(statement_, index, value.data(), static_cast<int>(value.size()),
                        SQLITE_TRANSIENT) != SQLITE_OK)
    db_.fail("bind");
  return *this;
}
Statement& Statement::bind(int index, std::optional<double> value) {
  if (!value) {
    sqlite3_bind_null(statement_, index);
    return *this;
  }
  return bind(index, *value);
}
Statement& Statement::bind(int index, std::optional<std::int64_t> value) {
  if (!value) {
    sqlite3_bind_null(statement_, index);
    return *this;
  }
  return bind(index, *value);
}
Statement& Statement::bind(int index, std::optional<std::string> value) {
  if (!value) {
    sqlite3_bind_null(statement_, index);
    return *this;
  }
  return bind(index, std::string_view(*value));
}

bool Statement::step() {
  const int rc = sqlite3_step(statement_);
  if (rc == SQLITE_ROW)
    return true;
  if (rc == SQLITE_DONE)
    return false;
  db_.fail("statement failed");
}

void Statement::run() {
  while (step()) {
  }
  reset();
}

void Statement::reset() {
  sqlite3_reset(statement_);
  sqlite3_clear_bindings(statement_);
}

std::int64_t Statement::integer(int column) const {
  return sqlite3_column_int64(statement_, column);
}
double Statement::real(int column) const {
  return sqlite3_column_double(statement_, column);
}
std::string Statement::text(int column) const {
  const auto* bytes = sqlite3_column_text(statement_, column);
  return bytes ? std::string(reinterpret_cast<const char*>(bytes),
                             static_cast<std::size_t>(sqlite3_column_bytes(statement_, column)))
               : std::string();
}
bool Statement::is_null(int column) const {
  return sqlite3_column_type(statement_, column) == SQLITE_NULL;
}
std::optional<double> Statement::optional_real(int column) const {
  return is_null(column) ? std::nullopt : std::optional<double>(real(column));
}
std::optional<std::int64_t> Statement::optional_integer(int column) const {
  return is_null(column) ? std::nullopt : std::optional<std::int64_t>(integer(column));
}

Transaction::Transaction(Database& db) : db_(db) {
  db_.execute("BEGIN IMMEDIATE");
}

Transaction::~Transaction() {
  if (!done_) {
    try {
      db_.execute("ROLLBACK");
    } catch (...) {  // nothing more to do: the connection rolls back on close too
    }
  }
}

void Transaction::commit() {
  db_.execute("COMMIT");
  done_ = true;
}

}  // namespace loom::service
