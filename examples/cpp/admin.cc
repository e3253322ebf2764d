// An administrative client: presents the node's admin credential (docs/security.md) and creates a channel.
//
//   admin --token-file STATE/credentials/operator.token [--factory URL | --factory-file FILE]
//
// Prints "channel ID". The credential is the token file's "NAME:SECRET", sent on every request as a
// CDR-encapsulated IDL string in service context 0x4E534A41, by an omniORB clientSendRequest interceptor
// registered right after ORB_init (omniORB C++ refuses it before: INITIALIZE), before the first call. Without it (or with a wrong one) the node refuses create_channel: NO_PERMISSION.
#include "common.hh"

#include <omniORB4/cdrStream.h>
#include <omniORB4/omniInterceptors.h>

namespace {

const CORBA::ULong NSJMS_CREDENTIAL = 0x4E534A41;
std::string token;

CORBA::Boolean present(omni::omniInterceptors::clientSendRequest_T::info_T& info) {
  cdrEncapsulationStream s(CORBA::ULong(0), CORBA::Boolean(1));
  s.marshalULong(CORBA::ULong(token.size() + 1));                 // IDL string: length with the NUL, chars, NUL
  s.put_octet_array(reinterpret_cast<const CORBA::Octet*>(token.c_str()), int(token.size() + 1));
  CORBA::Octet* data;
  CORBA::ULong max, len;
  s.getOctetStream(data, max, len);
  CORBA::ULong n = info.service_contexts.length();
  info.service_contexts.length(n + 1);
  info.service_contexts[n].context_id = NSJMS_CREDENTIAL;
  info.service_contexts[n].context_data.replace(max, len, data, 1);  // the sequence takes the buffer
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // take --token-file out of argv before the common options are parsed
  std::string token_file;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--token-file") == 0 && i + 1 < argc) token_file = argv[++i];
    else argv[kept++] = argv[i];
  }
  argc = kept;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!std::getline(in, token) || token.empty()) {
      std::cerr << "admin: no token in " << token_file << std::endl;
      return 2;
    }
  }
  try {
    CORBA::ORB_var orb = CORBA::ORB_init(argc, argv);
    if (!token.empty()) omniORB::getInterceptors()->clientSendRequest.add(present);  // after ORB_init, before calls
    example::Options o = example::parse(argc, argv);
    CosNotifyChannelAdmin::EventChannelFactory_var factory = example::resolve_factory(orb, o);
    CosNotification::QoSProperties qos;
    CosNotification::AdminProperties admin;
    CosNotifyChannelAdmin::ChannelID id;
    CosNotifyChannelAdmin::EventChannel_var channel = factory->create_channel(qos, admin, id);
    std::cout << "channel " << id << std::endl;
    orb->destroy();
    return 0;
  } catch (const CORBA::NO_PERMISSION&) {
    std::cerr << "admin: NO_PERMISSION: the node wants an operator's credential (--token-file)" << std::endl;
    return 4;
  } catch (const CORBA::Exception& e) {
    std::cerr << "admin: CORBA error " << e._name() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "admin: " << e.what() << std::endl;
    return 2;
  }
}
