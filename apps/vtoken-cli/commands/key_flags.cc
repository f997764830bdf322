#include "apps/vtoken-cli/commands/key_flags.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace vtoken::cli {

std::string KeyFlagHelp(const ConfigKey& key, const std::string& prefix) {
  std::string doc;
  for (char c : key.doc.substr(0, std::min(key.doc.find("; "), key.doc.find(". ")))) {
    if (c != '`') doc += c;  // Markdown in the docs, plain text in --help.
  }
  if (!doc.empty() && prefix.empty() && key.doc[0] != '`') {
    doc[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(doc[0])));
  }
  return prefix + doc;
}

CLI::Validator KeyValidator(const ConfigKey& key) {
  const std::string range = RangeText(key);
  const std::string what = std::string("must be ") +
                           (key.choices.empty() && key.range_text.empty()
                                ? std::string(KeyTypeNoun(key.type)) + (range.empty() ? "" : " ")
                                : "") +
                           range;
  return CLI::Validator(
      [key, what](std::string& text) -> std::string {
        KeyValue value;
        size_t used = 0;
        try {
          if (key.type == KeyType::kInt) {
            value = static_cast<int64_t>(std::stoll(text, &used));
          } else if (key.type == KeyType::kDouble) {
            const double d = std::stod(text, &used);
            if (!std::isfinite(d)) return what + ", got " + text;
            value = d;
          } else {
            value = text;
            used = text.size();
          }
        } catch (const std::exception&) {
          return what + ", got '" + text + "'";
        }
        if (used != text.size() || !CheckRange(key, value).empty()) return what + ", got " + text;
        // What only the key's setter checks (a device spec, an int32 field's bounds).
        ExperimentConfig scratch;
        if (Status set = key.set(scratch, value); !set.ok()) return set.message() + ", got " + text;
        return "";
      },
      what.substr(std::string("must be ").size()), "Key");
}

}  // namespace vtoken::cli
